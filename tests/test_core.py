"""The compiled core (batchsim/core/_core.c) against the Python engine: the same
scenario gives the same records, byte for byte.

The core is a second executor of the same rules: it interprets the built-in
policies' recipes (batchsim/policies/recipe.py) and the SimPy engine's step-by-step
semantics in C. Every test here runs a scenario through both
(``engine: python`` and ``engine: core``) and compares what they write:
requests, steps, inter-token gaps and the summary (less the keys that say
which engine ran). The SimPy engine is the reference. That an edited rule
moves both engines alike is tests/test_rules_once.py's subject.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsim.calibrate.costmodel import RooflineCostModel
from batchsim.calibrate.hardware import load_hardware
from batchsim.calibrate.models import load_model
from batchsim import core
from batchsim.app.config import scenario_from_dict
from batchsim.sim.errors import InputError
from batchsim.app.runner import Parts, build_parts, simulate
from tests.engine_helpers import POLICIES, AlarmInterrupts, Interrupt, _calibrated_like, _scenario, outcome, threads_back_to, written
from tests.test_properties import POLICY_SPECS, workloads

pytestmark = pytest.mark.skipif(core.library() is None, reason=f"no compiled core here: {core.library_error()}")

ITERATION = ("continuous", "continuous_mixed", "chunked_prefill")
ALL = ITERATION + ("static", "dynamic")


def _files(result, tmp_path, tag: str) -> dict[str, bytes]:
    files = written(result, tmp_path / tag)
    files["summary"] = json.dumps(outcome(result.summary), sort_keys=True).encode()
    return files


def _both(raw: dict, tmp_path, parts: Parts | None = None):
    """Run ``raw`` on both engines (same parts); return their files and results."""
    out = {}
    for engine in ("python", "core"):
        sc = scenario_from_dict(dict(raw, engine=engine))
        result = simulate(sc, parts if parts is not None else build_parts(sc))
        assert result.engine["engine"] == engine
        out[engine] = (_files(result, tmp_path, engine), result)
    return out


def _assert_same(out) -> None:
    (py, r_py), (c, r_c) = out["python"], out["core"]
    assert set(py) == set(c)
    for name in py:
        assert c[name] == py[name], name
    assert r_c.engine["steps"] == r_py.engine["steps"]


GRAPHS = {
    "vllm": {"decode_sizes": [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)],
             "step_sizes": [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]},
    "sglang": {"decode_sizes": [1, 2, 4, 8, 12, *range(16, 257, 8)],
               "step_sizes": [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
                              *range(1280, 4097, 256)], "step_max_padding": 2},
    "v0": {"decode_sizes": [1, 2, 4, *range(8, 257, 8)], "decode_max_context": 3000},
}


def _graphs(name: str, spec: dict) -> dict:
    """GRAPHS[name] within the policy's token budget (sizes above it are refused: no step reaches them)."""
    budget = spec.get("max_num_batched_tokens", 8192)
    return {k: [x for x in v if x <= budget] if isinstance(v, list) else v for k, v in GRAPHS[name].items()}

CASES = [(p, {}) for p in ALL] + [
    ("continuous", {"replicas": 3, "router": "least_kv"}),
    ("continuous", {"replicas": 3, "router": "least_outstanding"}),
    ("continuous_mixed", {"replicas": 2, "router": "round_robin"}),
    ("chunked_prefill", {"replicas": 3, "router": "least_outstanding"}),
    ("chunked_prefill", {"replicas": 2, "router": "least_kv"}),
    ("chunked_prefill", {"replicas": 3, "router": "power_of_two"}),
    ("static", {"replicas": 2, "router": "power_of_two", "horizon_s": 20.0}),
    ("continuous", {"policy": {"name": "continuous", "max_num_seqs": 48, "order": "shortest_prompt_first"}}),
    ("chunked_prefill", {"replicas": 2, "policy": {"name": "chunked_prefill", "max_num_seqs": 48,
                                                   "max_num_batched_tokens": 256,
                                                   "order": "shortest_prompt_first"}}),
    ("continuous", {"horizon_s": 14.0}),
    ("chunked_prefill", {"horizon_s": 9.0, "max_queue_len": 5}),
    ("continuous", {"measure": {"records": "aggregate", "warmup_s": 2.0, "cooldown_s": 2.0}}),
    ("chunked_prefill", {"replicas": 2, "measure": {"records": "aggregate"}}),
    ("continuous", {"tensor_parallel_size": 2, "dtype": "fp8"}),
    ("static", {"replicas": 2, "router": "least_outstanding"}),
    ("dynamic", {"replicas": 3, "router": "least_kv", "measure": {"records": "aggregate"}}),
    ("dynamic", {"horizon_s": 9.0, "max_queue_len": 5}),
    ("static", {"horizon_s": 7.0, "policy": {"name": "static", "max_batch_size": 6, "timeout_s": 0.0,
                                             "complete_at": "own_token"}}),
    *[(p, {"policy": dict(POLICIES[p], admission=a)}) for p in ITERATION
      for a in ("sequence", "completion", "remaining")],
    # vLLM V0's admission watermark (0.3: some prompts can never leave it free) and SGLang's retraction victim
    *[(p, {"policy": dict(POLICIES[p], watermark=w, victim=v)}) for p in ITERATION
      for w, v in ((0.01, "last_admitted"), (0.0, "fewest_decoded"), (0.3, "fewest_decoded"))],
    ("chunked_prefill", {"policy": dict(POLICIES["chunked_prefill"], watermark=0.05, admission="sequence")}),
    # steps planned ahead (vLLM async scheduling, SGLang/TensorRT-LLM overlap): arrivals and freed KV a plan late
    *[(p, {"policy": dict(POLICIES[p], schedule_ahead=True, admission=a)}) for p in ITERATION
      for a in ("step", "completion")],
    ("chunked_prefill", {"replicas": 3, "router": "least_kv", "horizon_s": 9.0, "max_queue_len": 5,
                         "policy": dict(POLICIES["chunked_prefill"], schedule_ahead=True, admission="remaining")}),
    # CUDA-graph padding: vLLM V1's sizes for every step, SGLang's decode and prefill sizes with the 2x limit,
    # vLLM V0's decode-only graphs with a context limit some rows pass
    *[(p, {"policy": dict(POLICIES[p], cuda_graphs=_graphs("vllm", POLICIES[p]))}) for p in ITERATION],
    ("chunked_prefill", {"replicas": 2, "router": "least_kv", "tensor_parallel_size": 2,
                         "policy": dict(POLICIES["chunked_prefill"], schedule_ahead=True,
                                        cuda_graphs=_graphs("sglang", POLICIES["chunked_prefill"]))}),
    ("continuous", {"policy": dict(POLICIES["continuous"], cuda_graphs=_graphs("v0", POLICIES["continuous"]))}),
    ("continuous_mixed", {"policy": dict(POLICIES["continuous_mixed"],
                                         cuda_graphs=_graphs("sglang", POLICIES["continuous_mixed"]))}),
]


@pytest.mark.parametrize("policy,extra", CASES, ids=[f"{p}-{'-'.join(e) or 'r1'}" for p, e in CASES])
def test_core_and_python_write_identical_outputs(policy, extra, tmp_path):
    spec = extra.get("policy", POLICIES[policy])
    out = _both(_scenario(spec, **{k: v for k, v in extra.items() if k != "policy"}), tmp_path)
    _assert_same(out)
    if not extra and policy in ("continuous", "chunked_prefill"):
        assert out["core"][1].summary["preemptions"] > 0  # KV pressure was real
    if "cuda_graphs" in spec:
        steps = out["core"][1].steps
        assert (steps["flops"] > steps["useful_flops"]).any()  # some steps ran padded to a capture size


@pytest.mark.parametrize("policy", ALL)
def test_core_prices_a_calibrated_profile_exactly(policy, tmp_path):
    """Measured ranges (out-of-range counts), a decode-step host term, tensor parallelism."""
    raw = _scenario(POLICIES[policy], model="llama-3-70b", hardware="h100-sxm", tensor_parallel_size=4)
    raw["policy"] = dict(raw["policy"], gpu_memory_utilization=0.9)
    sc = scenario_from_dict(raw)
    parts = build_parts(sc)
    cost = RooflineCostModel(load_model("llama-3-70b"), _calibrated_like("h100-sxm"), tp=4)
    out = _both(raw, tmp_path, replace(parts, cost=cost))
    _assert_same(out)
    assert out["core"][1].steps["out_of_range"].sum() > 0


def test_core_prices_the_committed_h200_profile_exactly(tmp_path):
    raw = _scenario(POLICIES["chunked_prefill"], hardware="h200-bf16")
    _assert_same(_both(raw, tmp_path))


def test_core_rejects_as_the_python_engine_does(tmp_path):
    """Prompts over the step budget (continuous), over max_model_len, over the KV cache."""
    raw = _scenario({"name": "continuous", "max_num_seqs": 16, "max_num_batched_tokens": 1500,
                     "max_model_len": 2500}, max_queue_len=4)
    out = _both(raw, tmp_path)
    _assert_same(out)
    reasons = out["core"][1].requests["reason"]
    assert reasons.str.startswith("needs ").any() and reasons.str.contains("max_model_len").any()
    assert reasons.str.startswith("queue full").any()
    raw = _scenario(POLICIES["chunked_prefill"])
    raw["policy"] = dict(raw["policy"], gpu_memory_utilization=0.2055)  # a KV cache smaller than some requests
    out = _both(raw, tmp_path / "kv")
    _assert_same(out)
    assert out["core"][1].requests["reason"].str.contains("KV capacity").any()
    for name, util in (("continuous", 0.22), ("chunked_prefill", 0.21)):  # prompts never leaving 30% free
        raw = _scenario(dict(POLICIES[name], watermark=0.3))
        raw["policy"] = dict(raw["policy"], gpu_memory_utilization=util)
        out = _both(raw, tmp_path / f"wm-{name}")
        _assert_same(out)
        reasons = out["core"][1].requests["reason"]
        assert reasons.str.contains("watermark").any() and (reasons == "").any()


@pytest.mark.parametrize("policy,replicas,router", [
    ("continuous", 1, "least_kv"), ("continuous_mixed", 2, "round_robin"), ("chunked_prefill", 3, "least_outstanding"),
    ("static", 1, "round_robin"), ("dynamic", 2, "least_kv")])
def test_core_orders_arrivals_tied_with_step_ends_as_simpy_does(policy, replicas, router, tmp_path):
    raw = _scenario(POLICIES[policy], replicas=replicas, router=router)
    sc = scenario_from_dict(dict(raw, engine="python"))
    parts = build_parts(sc)
    ends = simulate(sc, parts).steps["end"].to_numpy()
    ends = np.sort(ends)
    arrival = parts.workload.arrival.copy()
    for i in range(1, len(arrival), 3):  # every 3rd arrival onto the end of a step running when it arrived
        j = int(np.searchsorted(ends, arrival[i]))
        if j < len(ends) and ends[j] < (arrival[i + 1] if i + 1 < len(arrival) else np.inf):
            arrival[i] = ends[j]
    arrival[5:9] = arrival[5]  # and a burst of simultaneous arrivals
    parts = replace(parts, workload=replace(parts.workload, arrival=arrival))
    out = _both(raw, tmp_path, parts)
    _assert_same(out)
    ties = np.isin(arrival, out["python"][1].steps["end"].to_numpy()).sum()
    assert ties >= 1  # the case under test happened


_SPECS = st.one_of(
    POLICY_SPECS,
    st.builds(lambda s, t, m: {"name": m, "max_num_seqs": s, "max_num_batched_tokens": t,
                               "order": "shortest_prompt_first"},
              st.integers(1, 8), st.integers(64, 400), st.sampled_from(["continuous", "chunked_prefill"])),
    st.builds(lambda s, t, m, a, w, v, h, g: {"name": m, "max_num_seqs": s, "max_num_batched_tokens": t, "admission": a,
                                              "watermark": w, "victim": v, "schedule_ahead": h,
                                              "cuda_graphs": g and {key: [x for x in val if x <= t]
                                                                    if isinstance(val, list) else val
                                                                    for key, val in g.items()}},
              st.integers(1, 8), st.integers(64, 400), st.sampled_from(["continuous", "chunked_prefill"]),
              st.sampled_from(["step", "sequence", "completion", "remaining"]), st.sampled_from([0.0, 0.01, 0.1, 0.5]),
              st.sampled_from(["last_admitted", "fewest_decoded"]), st.booleans(),
              st.sampled_from([None, GRAPHS["vllm"], GRAPHS["sglang"], GRAPHS["v0"],
                               {"decode_sizes": [2, 5], "step_sizes": [3, 50, 51, 300], "step_max_padding": 1.5,
                                "decode_max_context": 40}])),
    st.builds(lambda b, t, c: {"name": "static", "max_batch_size": b, "timeout_s": t, "complete_at": c},
              st.integers(1, 6), st.sampled_from([0.0, 0.3]), st.sampled_from(["batch_end", "own_token"])),
)
_COST = RooflineCostModel(load_model("llama-3-8b"), load_hardware("l4"))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=_SPECS, wl=workloads(), blocks=st.integers(8, 120), bs=st.sampled_from([1, 8, 16]),  # sizes vLLM accepts
       horizon=st.sampled_from([None, None, 0.7, 3.0]), replicas=st.sampled_from([1, 1, 2, 3]),
       router=st.sampled_from(["round_robin", "least_kv", "least_outstanding", "power_of_two"]),
       records=st.sampled_from(["full", "full", "aggregate"]), queue=st.sampled_from([None, None, 2]))
def test_core_is_exact_on_random_workloads(spec, wl, blocks, bs, horizon, replicas, router, records, queue):
    """Tiny KV caches (preemption), simultaneous arrivals, horizons, queue limits, several replicas."""
    parts = Parts(workload=wl, cost=_COST, kv_tokens=lambda util, **kw: blocks * bs, max_model_len=4096)
    outs = []
    for engine in ("python", "core"):
        sc = scenario_from_dict({
            "model": "llama-3-8b", "hardware": "l4", "policy": dict(spec, block_size=bs), "replicas": replicas,
            "router": router, "horizon_s": horizon, "max_queue_len": queue, "engine": engine,
            "measure": {"records": records}, "workload": {"num_requests": 1}})
        r = simulate(sc, parts)
        outs.append((r.requests.to_csv(), r.steps.to_csv(), r.itl.frame().to_csv(), json.dumps(outcome(r.summary), sort_keys=True)))
    assert outs[0] == outs[1]


# -- which engine runs ------------------------------------------------------------------------------

def test_auto_takes_the_core_where_it_can_and_python_elsewhere():
    for policy, router, want in (("continuous", "round_robin", "core"), ("static", "least_kv", "core"),
                                 ("chunked_prefill", "power_of_two", "core"),
                                 ("continuous_prefix", "round_robin", "python")):
        spec = (dict(POLICIES["continuous"], enable_prefix_caching=True) if policy == "continuous_prefix"
                else POLICIES[policy])
        raw = _scenario(spec, replicas=2, router=router)
        raw["workload"] = dict(raw["workload"], num_requests=20, shared_prefix={"groups": 2, "tokens": 64})
        sc = scenario_from_dict(raw)
        assert simulate(sc, build_parts(sc)).engine["engine"] == want, policy


@pytest.mark.parametrize("change,reason", [
    ({"policy": {"name": "continuous", "enable_prefix_caching": True},
      "workload": {"num_requests": 5, "shared_prefix": {"groups": 2, "tokens": 64}}}, "a prefix cache"),
    ({"policy": {"name": "continuous"}, "replicas": 2, "router": "least_kv", "max_queue_len": 1 << 41},
     "max_queue_len"),
])
def test_engine_core_says_why_it_cannot_run_a_scenario(change, reason):
    raw = dict(_scenario(POLICIES["continuous"]), engine="core", **change)
    sc = scenario_from_dict(raw)
    with pytest.raises(InputError, match=f"engine: core cannot run this scenario: {reason}"):
        simulate(sc, build_parts(sc))


def test_without_a_compiler_auto_falls_back_and_core_says_why(monkeypatch):
    monkeypatch.setattr(core, "library", lambda: None)
    monkeypatch.setattr(core, "library_error", lambda: "cc: not found")
    raw = _scenario(POLICIES["continuous"])
    raw["workload"] = dict(raw["workload"], num_requests=20)
    sc = scenario_from_dict(raw)
    assert simulate(sc, build_parts(sc)).engine["engine"] == "python"
    sc = scenario_from_dict(dict(raw, engine="core"))
    with pytest.raises(InputError, match="could not be built"):
        simulate(sc, build_parts(sc))


def test_many_idle_deadlines_pending_at_once(tmp_path):
    """Each arrival wakes an idle static replica, which idles again with the same deadline: the
    earlier deadline timeouts wait in the event queue (the core's grows past its first size)."""
    raw = _scenario({"name": "static", "max_batch_size": 64, "timeout_s": 5.0}, replicas=2)
    raw["workload"] = dict(raw["workload"], num_requests=300, arrival={"process": "poisson", "rate": 40.0})
    out = _both(raw, tmp_path)
    _assert_same(out)


def _dense_cases():
    from batchsim.calibrate.models import load_model as lm
    out = []
    for model in ("llama-3-8b", "llama-2-7b", "llama-3-70b", "qwen2.5-7b", "mistral-7b", "yi-34b", "tiny-llama",
                  "tiny-llama-wide", "llama-3.1-405b", "mixtral-8x7b"):
        for hw in ("h100-sxm", "a100-80gb", "l4", "mi300x", "h200-bf16", "calibrated"):
            for tp, dtype in ((1, "bf16"), (2, "fp8"), (4, "int4"), (8, "bf16")):
                m = lm(model)
                if m.num_attention_heads % tp or (m.num_key_value_heads % tp and tp % m.num_key_value_heads):
                    continue
                out.append((model, hw, tp, dtype))
    return out


def test_the_core_computes_the_dense_operators_as_python_does():
    """Every non-MoE catalog model, shipped and calibrated profiles (measured ranges), tensor
    parallelism and weight dtypes: the core's dense totals equal RooflineCostModel._dense bit for bit."""
    rng = np.random.default_rng(3)
    tokens = np.unique(np.concatenate((np.arange(1, 70), rng.integers(1, 40000, 150), [2 ** k for k in range(17)])))
    checked = 0
    for model, hw, tp, dtype in _dense_cases():
        prof = _calibrated_like("h100-sxm") if hw == "calibrated" else load_hardware(hw)
        try:
            cm = RooflineCostModel(load_model(model), prof, tp=tp, dtype=dtype)
        except InputError:
            continue  # (a width tp does not divide)
        keys = [(int(t), int(s)) for t in tokens for s in (0, 1, min(int(t), 7), int(t))]
        got = core.dense_totals(cm, keys)
        if load_model(model).is_moe:
            assert got is None  # (left to Python)
            continue
        want = np.array([cm._dense(t, s) for t, s in keys], dtype=np.float64)
        bad = np.flatnonzero((got != want).any(axis=1))
        assert not len(bad), (model, hw, tp, dtype, keys[bad[0]], got[bad[0]], want[bad[0]])
        checked += 1
    assert checked >= 60


def test_a_huge_sequence_limit_on_a_small_workload_finishes(tmp_path):
    """max_num_seqs / max_batch_size far above the requests ("unlimited"): the core sizes its gap
    buffers by the rows a step can have (it used to ask for a flush forever)."""
    for spec in ({"name": "continuous", "max_num_seqs": 131072, "max_num_batched_tokens": 131072},
                 {"name": "static", "max_batch_size": 1 << 19}):
        raw = _scenario(spec)
        raw["workload"] = dict(raw["workload"], num_requests=30)
        sc = scenario_from_dict(dict(raw, policy=POLICIES["continuous"]))
        # (a KV cache of its own: the activation reserve for 131072 tokens would leave none)
        parts = replace(build_parts(sc), kv_tokens=lambda util, **kw: 200_000)
        _assert_same(_both(raw, tmp_path / spec["name"], parts))


def test_a_curve_read_just_below_its_last_point(tmp_path):
    """A size whose log rounds to the last point's log: both engines take the last segment
    (Python used to index past its slopes)."""
    import math

    from batchsim.calibrate.hardware import HardwareProfile

    data = load_hardware("h100-sxm").model_dump(mode="json")
    base = RooflineCostModel(load_model("llama-3-8b"), load_hardware("h100-sxm"))
    kv_elt, qo = base._attn[4], base._attn[5]
    per = (1000 + 1) * kv_elt + qo  # a decode of a 1000-token prompt's first output token, per kernel
    top = math.nextafter(per, math.inf)
    assert math.log(per) == math.log(top)
    mem = data["efficiency"]["attention_decode"]["memory"]
    data["efficiency"]["attention_decode"]["memory"] = [p for p in mem if p[0] < per] + [[top, mem[-1][1]]]
    cost = RooflineCostModel(load_model("llama-3-8b"), HardwareProfile.model_validate(data))
    from tests.engine_helpers import workload as mk

    raw = _scenario(POLICIES["continuous"])
    parts = Parts(workload=mk([0.0], [1000], [3]), cost=cost, kv_tokens=lambda util, **kw: 100000,
                  max_model_len=8192)
    _assert_same(_both(raw, tmp_path, parts))


def test_an_empty_prompt_fails_the_same_way_on_auto():
    from batchsim.sim.protocols import PolicyError
    from tests.engine_helpers import workload as mk

    raw = _scenario(POLICIES["continuous"])
    sc = scenario_from_dict(raw)
    parts = Parts(workload=mk([0.0, 1.0], [0, 5], [3, 3]), cost=_COST, kv_tokens=lambda util, **kw: 100000,
                  max_model_len=8192)
    with pytest.raises(PolicyError, match="scheduled 0 tokens"):
        simulate(sc, parts)


def test_progress_reports_a_run_in_flight():
    """What a benchmark's timeout report reads (bench/child.py): asked at a flush, mid-run."""
    from batchsim.sim.records import StepStream

    seen = []
    commit = StepStream.commit  # (the core writes a block into the stream's arrays, then commits it)

    def spy(self, k):
        seen.append(core.progress())
        return commit(self, k)

    raw = _scenario(POLICIES["continuous"])
    raw["workload"] = dict(raw["workload"], num_requests=2500)  # (~55k steps: several flushes of 16384)
    sc = scenario_from_dict(raw)
    parts = build_parts(sc)
    import unittest.mock as mock

    with mock.patch.object(StepStream, "commit", spy):
        result = simulate(sc, parts)
    assert result.engine["engine"] == "core" and len(seen) >= 2 and core.progress() is None
    first, last = seen[0], seen[-1]
    assert 0 < first["steps"] <= last["steps"] <= result.engine["steps"]
    assert 0 < first["arrived"] <= last["arrived"] <= 2500 and first["completed"] <= last["completed"]
    assert 0 < first["sim_s"] <= last["sim_s"]


@pytest.mark.parametrize("sets", [2, 16])
@pytest.mark.parametrize("policy,extra", [("static", {}), ("chunked_prefill", {"replicas": 3, "router": "least_kv"}),
                                          ("continuous", {"horizon_s": 14.0})])
def test_records_read_while_the_core_runs_on_are_exact(policy, extra, sets, tmp_path, monkeypatch):
    """The core runs on into the next free set of buffers while the ones it filled are read
    (run_core): with buffers of a few dozen steps and gaps (hundreds of hand-overs), two sets or
    sixteen, every record is still the Python engine's, byte for byte."""
    monkeypatch.setattr(core, "_STEP_CAP", 64)
    monkeypatch.setattr(core, "_GAP_CAP", 1)  # (the least the core takes: twice a step's rows)
    monkeypatch.setattr(core, "_SETS", sets)
    spec = extra.get("policy", POLICIES[policy])
    out = _both(_scenario(spec, **{k: v for k, v in extra.items() if k != "policy"}), tmp_path)
    _assert_same(out)
    assert out["core"][1].engine["steps"] > 20 * 64


def test_a_sink_that_fails_mid_run_stops_the_core_cleanly(monkeypatch):
    """An error while the records are read (a full disk, say) comes out as itself once the core,
    running on meanwhile, has stopped; the next run is unaffected."""
    from batchsim.sim.records import StepStream

    monkeypatch.setattr(core, "_STEP_CAP", 64)
    calls = []
    commit = StepStream.commit  # (the core writes a block into the stream's arrays, then commits it)

    def failing(self, k):
        calls.append(1)
        if len(calls) == 5:
            raise OSError("no space left on device")
        return commit(self, k)

    sc = scenario_from_dict(dict(_scenario(POLICIES["continuous"]), engine="core"))
    parts = build_parts(sc)
    monkeypatch.setattr(StepStream, "commit", failing)
    with pytest.raises(OSError, match="no space left"):
        simulate(sc, parts)
    assert core.progress() is None
    monkeypatch.setattr(StepStream, "commit", commit)
    assert simulate(sc, parts).engine["engine"] == "core"


@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="needs POSIX interval timers")
def test_interrupts_while_the_core_runs_on_leave_nothing_running(monkeypatch):
    """Ctrl-C twice, or a benchmark's alarm, lands anywhere in run_core (while a block is read,
    while the core thread is waited for, while it is being stopped): the run stops with the
    interrupt, and only once the core's call in flight returned; no thread is left running and
    no run is reported in progress."""
    import _thread

    monkeypatch.setattr(core, "_STEP_CAP", 64)
    sc = scenario_from_dict(dict(_scenario(POLICIES["continuous"]), engine="core"))
    parts = build_parts(sc)
    before = _thread._count()  # (threads running: the core's among them while one runs)

    with AlarmInterrupts() as alarms:
        for _ in range(12):
            alarms.arm(2)
            try:
                simulate(sc, parts)
            except Interrupt:
                pass
            finally:
                alarms.disarm()
            assert core.progress() is None
            assert threads_back_to(before)  # (one launched just before the interrupt exits at once: _CoreThread._began)
    assert simulate(sc, parts).engine["engine"] == "core"
