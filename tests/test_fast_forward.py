"""Exact fast-forward: many decode steps priced and applied at once give the
same records, bit for bit, as one step at a time.

The simulator's fast-forward is an optimisation with no semantic freedom:
these tests compare whole runs with it on and off (``Scenario.fast_forward``)
and the vectorized decode pricing with :meth:`RooflineCostModel.price`.
"""

from __future__ import annotations

import numpy as np
import pytest

from calibrate.costmodel import RooflineCostModel
from calibrate.hardware import HardwareProfile, load_hardware
from calibrate.models import load_model
from sim.types import StepShape
from tests.test_cost_model import flat_profile


def _calibrated_like(name: str) -> HardwareProfile:
    """A shipped profile with measured ranges added, so out-of-range counting varies."""
    data = load_hardware(name).model_dump(mode="json")
    for c, eff in data["efficiency"].items():
        eff["measured_range"] = {"tokens": [2, 200], "bytes": [1e5, 3e7]}
    data["calibrated"] = True
    data["provenance"]["calibration"] = {"device": "test", "software": {}, "date": "2025-01-01"}
    data["host_overhead"]["per_decode_step_us"] = 137.5  # decode steps' own host term in every fast path
    return HardwareProfile.model_validate(data)


@pytest.mark.parametrize("model,hw,tp", [
    ("llama-3.1-8b", "h100-sxm", 1), ("llama-3-70b", "h200", 4), ("mixtral-8x7b", "a100-80gb", 2),
    ("qwen2.5-7b", "l4", 1), ("tiny-llama", "calibrated", 1), ("llama-2-7b", "flat", 1),
])
def test_price_decodes_equals_price_step_by_step(model, hw, tp):
    prof = {"calibrated": lambda: _calibrated_like("h100-sxm"),
            "flat": lambda: flat_profile(launch_us=3.0, host_us=20.0, per_seq_us=1.5)}.get(
        hw, lambda: load_hardware(hw))()
    cm = RooflineCostModel(load_model(model), prof, tp=tp)
    rng = np.random.default_rng(7)
    for rows in (1, 2, 7, 64, 255):
        kv = rng.integers(1, 4000, size=rows)
        for stride in (rows, 3 * rows):  # every row grows by one, or padded rows billed wider
            count = 40
            run = cm.price_decodes(rows, int(kv.sum()), count, stride, sampled=rows)
            for j in range(count):
                extra = j * stride // rows
                step_kv = kv + extra
                step_kv[: (j * stride) % rows] += 1  # any split of the total prices the same
                want = cm.price(StepShape(q=np.ones(rows, dtype=np.int64), kv=step_kv, sampled=rows))
                got = run.step(j)
                assert got == want, (rows, stride, j, got, want)
                assert isinstance(got.seconds, float) and isinstance(got.out_of_range, int)


# -- whole runs: fast-forward on and off give the same outputs, byte for byte ----------------------

from sim.config import scenario_from_dict  # noqa: E402
from sim.runner import build_parts, simulate, write_outputs  # noqa: E402

POLICIES = {
    "static": {"name": "static", "max_batch_size": 6, "timeout_s": 0.2},
    "dynamic": {"name": "dynamic", "max_batch_size": 8, "max_queue_delay_s": 0.05},
    "continuous": {"name": "continuous", "max_num_seqs": 48},
    "continuous_mixed": {"name": "continuous", "prefill_mode": "mixed", "max_num_seqs": 48},
    "chunked_prefill": {"name": "chunked_prefill", "max_num_seqs": 48, "max_num_batched_tokens": 256},
}


def _scenario(policy: dict, **kw) -> dict:
    base = {
        "model": "llama-3-8b", "hardware": "h100-sxm", "seed": 3,
        # a small KV cache (about 4k blocks of 16) so decodes outgrow it and preempt
        "policy": dict(policy, gpu_memory_utilization=0.245),
        "workload": {"num_requests": 150, "arrival": {"process": "poisson", "rate": 6.0},
                     "prompt_tokens": {"dist": "lognormal", "median": 600, "p90": 3000, "max": 6000},
                     "output_tokens": {"dist": "lognormal", "median": 150, "p90": 600, "max": 900}},
    }
    base.update(kw)
    return base


def _outputs(raw: dict, fast_forward: bool, tmp_path, tag: str):
    sc = scenario_from_dict(dict(raw, fast_forward=fast_forward, engine="python"))  # (the Python engine: tests/test_core.py covers the core)
    result = simulate(sc, build_parts(sc))
    return written(result, tmp_path / f"{tag}-{fast_forward}"), result


def written(result, folder) -> dict[str, bytes]:
    """What a run writes (write_outputs' files) plus its gap records, as bytes by name."""
    out = write_outputs(result, folder)
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    files["itl"] = result.itl.to_csv(index=False).encode()
    return files


CASES = [(p, {}) for p in POLICIES] + [
    ("continuous", {"replicas": 3, "router": "least_kv"}),
    ("chunked_prefill", {"replicas": 2, "router": "power_of_two"}),
    ("static", {"replicas": 2, "router": "least_outstanding"}),
    # runs go on through arrivals routed to other replicas and are cut by their own
    ("continuous", {"replicas": 3, "router": "least_outstanding"}),
    ("continuous_mixed", {"replicas": 2, "router": "round_robin"}),
    ("continuous", {"horizon_s": 14.0}),
    ("dynamic", {"horizon_s": 9.0, "max_queue_len": 5}),
]


@pytest.mark.parametrize("policy,extra", CASES, ids=[f"{p}-{'-'.join(e) or 'r1'}" for p, e in CASES])
def test_fast_forward_on_and_off_write_identical_outputs(policy, extra, tmp_path):
    raw = _scenario(POLICIES[policy], **extra)
    off, r_off = _outputs(raw, False, tmp_path, "x")
    on, r_on = _outputs(raw, True, tmp_path, "x")
    assert r_off.engine["fast_forward_steps"] == 0
    # the test must exercise the fast path: most steps are applied in bulk
    assert r_on.engine["fast_forward_steps"] > 0.3 * r_on.engine["steps"], r_on.engine
    assert set(on) == set(off)
    for name in off:
        assert on[name] == off[name], name
    if policy == "continuous" and not extra:
        assert r_on.summary["preemptions"] > 0  # KV pressure was real


@pytest.mark.parametrize("policy,replicas,router", [
    ("continuous", 1, "least_kv"), ("static", 1, "least_kv"), ("dynamic", 2, "least_kv"),
    ("continuous", 2, "round_robin"), ("chunked_prefill", 3, "least_outstanding")])
def test_fast_forward_handles_arrivals_tied_with_step_ends(policy, replicas, router, tmp_path):
    """Arrivals placed exactly on step boundaries of the step-by-step run."""
    raw = _scenario(POLICIES[policy], replicas=replicas, router=router)
    sc = scenario_from_dict(dict(raw, fast_forward=False, engine="python"))
    parts = build_parts(sc)
    ref = simulate(sc, parts)
    ends = ref.steps["end"].to_numpy()
    wl = parts.workload
    arrival = wl.arrival.copy()
    # move every 3rd arrival onto the end of a step that was running when it arrived
    for i in range(1, len(arrival), 3):
        j = int(np.searchsorted(ends, arrival[i]))
        if j < len(ends) and ends[j] < (arrival[i + 1] if i + 1 < len(arrival) else np.inf):
            arrival[i] = ends[j]
    from dataclasses import replace
    parts = replace(parts, workload=replace(wl, arrival=arrival))
    outs = []
    for ff in (False, True):
        sc = scenario_from_dict(dict(raw, fast_forward=ff, engine="python"))
        r = simulate(sc, parts)
        outs.append((r.requests.to_csv(), r.steps.to_csv(), r.itl.to_csv(), r.summary))
        if not ff:
            ties = np.isin(arrival, r.steps["end"].to_numpy()).sum()
            assert ties >= 1  # the case under test happened
    assert outs[0] == outs[1]


# -- random workloads x random policy knobs (the property-test strategies) ------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import policies  # noqa: E402
from tests.engine_helpers import run_engine  # noqa: E402
from tests.test_properties import POLICY_SPECS, workloads  # noqa: E402

_TINY_COST = RooflineCostModel(load_model("llama-3-8b"), load_hardware("l4"))


def _canonical(req, steps, itl):
    order = np.lexsort((steps["replica"].to_numpy(), steps["end"].to_numpy()))
    steps = steps.iloc[order].reset_index(drop=True)
    itl = itl.sort_values("rid", kind="stable").reset_index(drop=True)
    return req.to_csv(), steps.to_csv(), itl.to_csv()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=POLICY_SPECS, wl=workloads(), blocks=st.integers(8, 120), bs=st.sampled_from([4, 8, 16]),
       horizon=st.sampled_from([None, None, 0.7, 3.0]), replicas=st.sampled_from([1, 1, 2]),
       router=st.sampled_from(["round_robin", "least_kv", "least_outstanding"]))
def test_fast_forward_is_exact_on_random_workloads(spec, wl, blocks, bs, horizon, replicas, router):
    outs = []
    for ff in (False, True):
        req, steps, itl, cluster = run_engine(
            lambda: policies.create_policy(spec), wl, cost=_TINY_COST, kv_blocks=blocks, block_size=bs,
            horizon=horizon, replicas=replicas, router=router, fast_forward=ff)
        outs.append(_canonical(req, steps, itl))
        if not ff:
            assert sum(r.fast_forward_steps for r in cluster.replicas) == 0
    assert outs[0] == outs[1]


def test_timeout_at_lands_exactly_where_no_delay_does():
    import simpy

    from sim.engine import _timeout_at

    start, end = 0.12358392425644199, 0.9801597871204101
    assert all(start + d != end for d in (end - start, np.nextafter(end - start, 1), np.nextafter(end - start, 0)))
    env = simpy.Environment()
    seen = []

    def proc():
        yield env.timeout(start)
        yield _timeout_at(env, end)
        seen.append(env.now)

    env.process(proc())
    env.run()
    assert seen == [end]
