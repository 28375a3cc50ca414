"""Fuzzing scenario dicts: every case is a clean InputError or a valid, conserved run.

Hypothesis mutates a tiny valid scenario (a few requests) with malformed,
extreme and adversarial values: wrong types, NaN/inf, huge and negative
numbers, unknown keys, deleted keys, markup-like and control-character
strings. Each example runs in-process through ``scenario_from_dict``,
``build_parts`` and ``simulate`` under a per-example deadline; anything but an
:class:`InputError` or a result whose requests are conserved fails.
"""

from __future__ import annotations

import copy
import os
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from batchsim import policies
from batchsim.app.config import scenario_from_dict
from batchsim.sim.errors import InputError
from batchsim.app.runner import build_parts
from tests.test_overload import simulate_checked

BASE = {
    "name": "fuzz",
    "model": "llama-3-8b",
    "hardware": "h100-sxm",
    "policy": {"name": "continuous"},
    "workload": {
        "num_requests": 4,
        "arrival": {"process": "poisson", "rate": 10.0},
        "prompt_tokens": {"dist": "fixed", "value": 64},
        "output_tokens": {"dist": "fixed", "value": 8},
    },
}

# Values that break naive code: types, non-finite and extreme numbers, odd strings.
WEIRD = st.one_of(
    st.none(), st.booleans(),
    st.integers(),
    st.sampled_from([0, -1, 1, 2, 2**31, 2**53 + 1, 2**63, 2**64, 10**30, -(10**30)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, 5e-324, -0.0, 1e-300, 1e-9, 1e9, float("nan"), float("inf"), -float("inf")]),
    st.text(max_size=12),
    st.sampled_from(["", " ", "[/x]", "[bold]", "\x00", "inf", "nan", "1e400", "-1", "☃" * 50,
                     "llama-3-8b", "h100-sxm", "continuous", "static", "../../etc/passwd", "/dev/null"]),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.sampled_from(["name", "x", "process", "dist", "value", "rate"]),
                    st.one_of(st.integers(-2, 10), st.text(max_size=4)), max_size=3),
)

# Every field a scenario has, and the sections the mutations may replace.
PATHS = [
    ("name",), ("model",), ("hardware",), ("tensor_parallel_size",), ("dtype",), ("kv_cache_dtype",),
    ("replicas",), ("router",), ("seed",), ("horizon_s",), ("max_queue_len",), ("policy",),
    ("policy", "name"), ("policy", "block_size"), ("policy", "gpu_memory_utilization"),
    ("policy", "max_model_len"), ("policy", "max_num_seqs"), ("policy", "max_num_batched_tokens"),
    ("policy", "order"), ("policy", "prefill_mode"), ("policy", "max_batch_size"), ("policy", "timeout_s"),
    ("policy", "max_queue_delay_s"), ("policy", "preferred_batch_sizes"), ("policy", "complete_at"),
    ("policy", "enable_prefix_caching"),
    ("workload",), ("workload", "num_requests"), ("workload", "duration_s"), ("workload", "arrival"),
    ("workload", "arrival", "process"), ("workload", "arrival", "rate"), ("workload", "arrival", "cv"),
    ("workload", "prompt_tokens"), ("workload", "prompt_tokens", "dist"), ("workload", "prompt_tokens", "value"),
    ("workload", "output_tokens", "value"), ("workload", "trace"), ("workload", "shared_prefix"),
    ("slo",), ("slo", "ttft_ms"), ("slo", "tpot_ms"), ("measure",), ("measure", "warmup_s"),
    ("measure", "cooldown_s"), ("measure", "step_records"), ("policy_knobs",), ("bogus_field",),
]

# Well-formed sections with adversarial numbers, so that runs (not only validation) are fuzzed.
NUM = st.one_of(st.floats(0, 1e6), st.sampled_from([0.0, 1e-300, 5e-324, 1e-6, 1e308, 1e15]))
POS_INT = st.one_of(st.integers(1, 20_000), st.sampled_from([1, 2**20, 2**40, 2**40 + 1]))
ARRIVALS = st.one_of(
    st.builds(lambda r: {"process": "poisson", "rate": r}, NUM),
    st.builds(lambda r: {"process": "constant", "rate": r}, NUM),
    st.builds(lambda r, cv: {"process": "gamma", "rate": r, "cv": cv}, NUM,
              st.sampled_from([1e-300, 1e-3, 0.5, 4.0, 100.0, 1e5])),
    st.builds(lambda a, b, on, off: {"process": "onoff", "rate_on": a, "rate_off": b, "mean_on_s": on,
                                     "mean_off_s": off}, NUM, NUM,
              st.sampled_from([1e-300, 1e-3, 0.5, 1e9]), st.sampled_from([1e-3, 2.0, 1e300])),
    st.builds(lambda r, a, p, ph: {"process": "diurnal", "rate": r, "amplitude": a, "period_s": p, "phase_s": ph},
              NUM, st.floats(0, 1), st.sampled_from([1e-300, 1.0, 86400.0, 1e300]),
              st.sampled_from([-1e300, 0.0, 3.0, 1e300])),
)
LENGTHS = st.one_of(
    st.builds(lambda v: {"dist": "fixed", "value": v}, POS_INT),
    st.builds(lambda a, b: {"dist": "uniform", "min": min(a, b), "max": max(a, b)}, POS_INT, POS_INT),
    st.builds(lambda m, k: {"dist": "lognormal", "median": m, "p90": m * k},
              st.sampled_from([1.0, 100.0, 5000.0, 2.0**39]), st.sampled_from([1.0, 2.0, 1e6])),
)
POLICIES = st.one_of(
    st.builds(lambda n, s, b, m: {"name": n, "max_num_seqs": s, "max_num_batched_tokens": b, "max_model_len": m},
              st.sampled_from(["continuous", "chunked_prefill"]), st.integers(1, 300), st.integers(1, 20_000),
              st.one_of(st.none(), st.integers(1, 20_000))),
    st.builds(lambda n, b, t: {"name": n, "max_batch_size": b, "timeout_s": t}, st.just("static"),
              st.integers(1, 64), st.sampled_from([0.0, 1e-300, 0.01, 1e300])),
    st.builds(lambda b, d, p: {"name": "dynamic", "max_batch_size": b, "max_queue_delay_s": d,
                               "preferred_batch_sizes": p},
              st.integers(1, 64), st.sampled_from([0.0, 1e-300, 0.01, 1e300]),
              st.lists(st.integers(1, 80), max_size=3)),
    st.builds(lambda n, bs, g: {"name": n, "block_size": bs, "gpu_memory_utilization": g},
              st.sampled_from(["continuous", "chunked_prefill", "static", "dynamic"]),
              st.sampled_from([1, 16, 4096, 10**9]), st.sampled_from([1e-9, 0.25, 0.9, 1.0])),
)
KNOB_VALUES = st.one_of(
    st.integers(-2, 300), st.sampled_from([0, 2**31, 2**63, 10**30]),
    st.sampled_from([0.0, 1e-300, 0.01, 0.5, 1.0, 1e300, float("inf"), float("nan"), -1.0]),
    st.sampled_from(["fcfs", "shortest_prompt_first", "mixed", "separate", "batch_end", "own_token", ""]),
    st.booleans(), st.none(), st.lists(st.integers(-1, 80), max_size=3),
)


@st.composite
def policy_with_knobs(draw):
    """A built-in policy with 1-3 of its own knobs set to adversarial values."""
    name = draw(st.sampled_from(policies.policy_names()))
    knobs = sorted(f for f in policies.policy_class(name).Config.model_fields if f != "name")
    chosen = draw(st.lists(st.sampled_from(knobs), min_size=1, max_size=3, unique=True))
    return {"name": name, **{k: draw(KNOB_VALUES) for k in chosen}}


POLICIES = st.one_of(POLICIES, policy_with_knobs())

SECTIONS = {
    ("workload", "arrival"): ARRIVALS,
    ("workload", "prompt_tokens"): LENGTHS,
    ("workload", "output_tokens"): LENGTHS,
    ("policy",): POLICIES,
    ("horizon_s",): st.one_of(st.none(), st.sampled_from([1e-300, 1e-6, 0.05, 2.0, 1e300])),
    ("max_queue_len",): st.one_of(st.none(), st.integers(1, 3)),
    ("replicas",): st.integers(1, 3),
    ("router",): st.sampled_from(["round_robin", "least_outstanding", "power_of_two", "least_kv"]),
    ("model",): st.sampled_from(["llama-3-8b", "llama-3.1-8b", "mixtral-8x7b", "llama-3-70b", "qwen2.5-7b"]),
    ("hardware",): st.sampled_from(["h100-sxm", "l4", "a100-40gb", "mi300x"]),
    ("tensor_parallel_size",): st.sampled_from([1, 2, 3, 8]),
    ("dtype",): st.sampled_from(["bf16", "fp8", "int4"]),
    ("workload", "duration_s"): st.sampled_from([0.0, 1e-300, 0.5, 1e300]),
    ("measure",): st.builds(lambda w, c: {"warmup_s": w, "cooldown_s": c},
                            st.sampled_from([0.0, 0.1, 1e300]), st.sampled_from([0.0, 0.1, 1e300])),
}
SECTION_KEYS = list(SECTIONS)


def _set(d: dict, path: tuple, value) -> None:
    for k in path[:-1]:
        if not isinstance(d.get(k), dict):
            d[k] = {}
        d = d[k]
    d[path[-1]] = value


def _delete(d: dict, path: tuple) -> None:
    for k in path[:-1]:
        d = d.get(k)
        if not isinstance(d, dict):
            return
    d.pop(path[-1], None)


MUTATION = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(PATHS), WEIRD),
    st.tuples(st.just("delete"), st.sampled_from(PATHS), st.none()),
    st.sampled_from(SECTION_KEYS).flatmap(lambda p: st.tuples(st.just("set"), st.just(p), SECTIONS[p])),
)


def mutate(mutations: list) -> dict:
    data = copy.deepcopy(BASE)
    for op, path, value in mutations:
        if op == "set":
            _set(data, path, value)
        else:
            _delete(data, path)
    return data


def check(data) -> str:
    """Validate and (when it is small) run ``data``: 'error', 'run' or 'skipped'."""
    try:
        sc = scenario_from_dict(data, "fuzz.yaml")
    except InputError as e:
        assert str(e).strip() and "Traceback" not in str(e)
        return "error"
    n = sc.workload.num_requests
    if n is None or n > 50:  # keep runs tiny; validation of big ones is still fuzzed above
        return "skipped"
    try:
        parts = build_parts(sc)
        wl = parts.workload
        fits = wl.prompt_tokens + wl.output_tokens <= parts.max_model_len
        if fits.any() and wl.output_tokens[fits].max() > 20_000 and (sc.horizon_s or 1e9) > 10:
            return "skipped"  # a legitimately long run (one step per output token); not what we fuzz
        simulate_checked(sc, parts)
    except InputError as e:
        assert str(e).strip()
        return "error"
    return "run"


# More examples for a bug hunt: FUZZ_EXAMPLES=5000 pytest tests/test_fuzz_scenarios.py
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=timedelta(seconds=5),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.timeout(max(240, EXAMPLES))
@FUZZ
@given(st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_scenarios_end_in_an_input_error_or_a_conserved_run(mutations):
    event(check(mutate(mutations)))


@pytest.mark.timeout(max(240, EXAMPLES))
@settings(max_examples=EXAMPLES // 2, deadline=timedelta(seconds=5))
@given(st.lists(st.sampled_from(SECTION_KEYS).flatmap(lambda p: st.tuples(st.just("set"), st.just(p), SECTIONS[p])),
                min_size=1, max_size=5))
def test_well_formed_extreme_scenarios_run_or_fail_cleanly(mutations):
    event(check(mutate(mutations)))


@settings(max_examples=100, deadline=timedelta(seconds=2))
@given(WEIRD)
def test_the_whole_scenario_being_any_value_is_an_input_error(value):
    if isinstance(value, dict):
        value = {**value, "workload": None}
    with pytest.raises(InputError):
        scenario_from_dict(value, "fuzz.yaml")
