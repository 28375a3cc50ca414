"""Overload is bounded and nothing is lost: horizon, queue limit, never-fit requests, tiny workloads.

Every run here goes through :func:`assert_conserved`: each request that
arrived is exactly one of completed, rejected (with its reason) or
unfinished, and the summary's counts add up. The fuzz tests import it too.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from batchsim.app.config import scenario_from_dict
from batchsim.app import runner
from batchsim.app.runner import RunResult, build_parts, simulate

POLICIES = ("static", "dynamic", "continuous", "chunked_prefill")
STATUSES = {"completed", "rejected", "unfinished"}


def assert_conserved(result: RunResult, arrivals: np.ndarray | None = None) -> None:
    """arrived = completed + rejected + unfinished, per request and in the summary.

    ``arrivals`` (the workload's arrival times) also checks that no request
    that arrived before the end of the run is missing from the records.
    """
    req, s = result.requests, result.summary
    st = req["status"]
    assert set(st.unique()) <= STATUSES, st.unique()
    n = {x: int((st == x).sum()) for x in STATUSES}
    assert n["completed"] + n["rejected"] + n["unfinished"] == len(req) == s["num_requests"]
    assert s["completed"] + s["rejected"] + s["unfinished"] == s["measured_requests"] <= len(req)
    assert req["rid"].is_unique
    done, rej, unf = req[st == "completed"], req[st == "rejected"], req[st == "unfinished"]
    assert (done["generated_tokens"] == done["output_tokens"]).all()
    assert (done["completion"] >= done["arrival"]).all() and (done["first_token"] <= done["completion"]).all()
    assert (rej["reason"].str.len() > 0).all() and (rej["generated_tokens"] == 0).all()
    assert (unf["generated_tokens"] < unf["output_tokens"]).all()
    if arrivals is not None:
        horizon = result.scenario.horizon_s
        if horizon is None:
            assert len(req) == len(arrivals)
        else:  # an arrival exactly at the horizon may land on either side of it
            assert (arrivals < horizon * (1 - 1e-12)).sum() <= len(req) <= (arrivals <= horizon).sum()
        assert np.array_equal(req["arrival"].to_numpy(), arrivals[: len(req)])


class _Recording(runner.Cluster):
    """The runner's Cluster, remembered so a test can look at the replicas after the run."""

    last = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _Recording.last = self


def simulate_checked(sc, parts) -> RunResult:
    """``simulate`` plus the conservation checks, done here independently of the
    runner's own: every unfinished request is still queued or running on a
    replica (none was lost)."""
    cluster_class, runner.Cluster = runner.Cluster, _Recording
    _Recording.last = None
    try:
        result = simulate(sc, parts)
    finally:
        runner.Cluster = cluster_class
    assert_conserved(result, parts.workload.arrival)
    if result.engine["engine"] == "core":  # (no Python replicas: the core counts its queues itself)
        held = result.engine["held"]
    else:
        held = sum(s.status == "unfinished" for r in _Recording.last.replicas for s in (*r.waiting, *r.running))
    assert held == int((result.requests["status"] == "unfinished").sum())
    return result


def run(data: dict, base_dir: Path | None = None) -> RunResult:
    """Validate, build and simulate ``data``; check conservation; return the result."""
    sc = scenario_from_dict(data)
    return simulate_checked(sc, build_parts(sc, base_dir))


def chat(policy: str, rate: float, n: int, prompt: int = 512, output: int = 128, **extra) -> dict:
    return {"model": "llama-3-8b", "hardware": "h100-sxm", "policy": policy, **extra,
            "workload": {"num_requests": n, "arrival": {"process": "poisson", "rate": rate},
                         "prompt_tokens": {"dist": "fixed", "value": prompt},
                         "output_tokens": {"dist": "fixed", "value": output}}}


def capacity(policy: str) -> float:
    """Requests/s the policy sustains: throughput with a deep backlog."""
    return run(chat(policy, 1e6, 400)).summary["request_throughput"]


@pytest.mark.parametrize("policy", POLICIES)
def test_ten_times_capacity_with_a_horizon_ends_promptly_and_reports_the_unfinished(policy):
    cap = capacity(policy)
    horizon = 10.0
    t0 = time.perf_counter()
    res = run(chat(policy, 10 * cap, 1_000_000, horizon_s=horizon))
    wall = time.perf_counter() - t0
    s = res.summary
    arrived = s["num_requests"]
    assert arrived == pytest.approx(10 * cap * horizon, rel=0.1)  # the offered load really arrived
    assert s["unfinished"] > 0.8 * arrived  # most of it is still queued at the horizon
    assert 0 < s["completed"] < 1.5 * cap * horizon  # service stays at capacity, not beyond
    assert s["rejected"] == 0
    assert s["duration_s"] == pytest.approx(horizon, rel=1e-6)
    assert wall < 20, f"{policy}: {wall:.1f} s of wall time for {arrived} arrivals"


def test_max_queue_len_rejects_the_overflow_with_its_reason():
    res = run(chat("continuous", 1e6, 2000, max_queue_len=50))
    s, req = res.summary, res.requests
    assert s["rejected"] > 1000 and s["completed"] + s["rejected"] == 2000 and s["unfinished"] == 0
    assert set(req.loc[req.status == "rejected", "reason"]) == {"queue full (50 waiting)"}
    assert res.steps["waiting"].max() <= 50


def test_max_queue_len_and_horizon_together_bound_a_huge_offered_load():
    t0 = time.perf_counter()
    res = run(chat("continuous", 1e5, 1_000_000, horizon_s=2.0, max_queue_len=100))
    assert time.perf_counter() - t0 < 20
    s = res.summary
    assert s["num_requests"] > 150_000 and s["rejected"] > 0.99 * s["num_requests"]
    assert 0 < s["unfinished"] <= 100 + 256  # at most a full queue plus a full batch


@pytest.mark.parametrize("policy", POLICIES)
def test_requests_beyond_the_context_length_are_rejected_with_the_reason(policy):
    # llama-3-8b: max_position_embeddings 8192
    res = run(chat(policy, 100.0, 3, prompt=8000, output=193))
    req = res.requests
    assert list(req.status) == ["rejected"] * 3
    assert set(req.reason) == {"prompt+output 8193 > max_model_len 8192"}
    assert res.summary["rejected"] == 3 and res.summary["completed"] == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_requests_beyond_the_kv_capacity_are_rejected_with_the_reason(policy):
    # max_model_len raised past the KV capacity (the runner takes the smaller of
    # the model's and the policy's limit, so raise the model's via a long-context model).
    data = chat(policy, 100.0, 2, prompt=120_000, output=100)
    data.update(model="llama-3.1-8b", policy={"name": policy, "gpu_memory_utilization": 0.3})
    res = run(data)
    req = res.requests
    cap = res.meta["kv_capacity_tokens"]
    assert cap < 120_100 and list(req.status) == ["rejected"] * 2
    assert set(req.reason) == {f"prompt+output 120100 tokens > KV capacity {cap}"}


def test_a_mix_of_runnable_and_impossible_requests_finishes_the_runnable_ones():
    data = chat("continuous", 50.0, 60)
    data["workload"]["prompt_tokens"] = {"dist": "uniform", "min": 1, "max": 12_000}
    res = run(data)
    s = res.summary
    assert s["rejected"] > 0 and s["completed"] > 0 and s["unfinished"] == 0
    long = res.requests.prompt_tokens + res.requests.output_tokens > 8192
    assert (res.requests.status[long] == "rejected").all() and (res.requests.status[~long] == "completed").all()


@pytest.mark.parametrize("policy", POLICIES)
def test_zero_rate_runs_with_no_requests(policy):
    res = run(chat(policy, 0.0, 10))
    s = res.summary
    assert (s["num_requests"], s["completed"], s["rejected"], s["unfinished"]) == (0, 0, 0, 0)
    assert s["request_throughput"] == 0.0 and s["num_steps"] == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_a_single_request_completes(policy):
    res = run(chat(policy, 1.0, 1))
    s = res.summary
    assert (s["num_requests"], s["completed"], s["rejected"], s["unfinished"]) == (1, 1, 0, 0)
    assert s["median_ttft_ms"] > 0 and s["median_tpot_ms"] > 0


@pytest.mark.parametrize("trace", [
    {"format": "csv", "path": "t.csv", "max_requests": 0},
    {"format": "csv", "path": "t.csv", "start_s": 5.0},
])
def test_an_empty_trace_selection_runs_with_no_requests(tmp_path, trace):
    (tmp_path / "t.csv").write_text("arrival,prompt_tokens,output_tokens\n0,10,5\n1,10,5\n")
    if "start_s" in trace:  # a window after the last request is an error that says what the trace spans
        from batchsim.sim.errors import InputError

        with pytest.raises(InputError, match=r"no requests in the window start_s=5.0, end_s=None; "
                                             r"the trace spans 0 to 1 s after its first request"):
            run({"workload": {"trace": trace}}, tmp_path)
        return
    s = run({"workload": {"trace": trace}}, tmp_path).summary
    assert (s["num_requests"], s["completed"], s["unfinished"]) == (0, 0, 0)


def test_horizon_before_the_first_step_ends_reports_everything_unfinished():
    res = run(chat("continuous", 1000.0, 50, horizon_s=1e-6))
    s = res.summary
    assert s["num_requests"] == 1 and s["unfinished"] == 1 and s["completed"] == 0


def test_horizon_after_the_last_completion_changes_nothing():
    a = run(chat("chunked_prefill", 20.0, 40)).summary
    b = run(chat("chunked_prefill", 20.0, 40, horizon_s=1e6)).summary
    assert a["completed"] == b["completed"] == 40 and a["median_e2el_ms"] == b["median_e2el_ms"]


def test_replicas_and_every_router_conserve_requests():
    for router in ("round_robin", "least_outstanding", "power_of_two", "least_kv"):
        res = run(chat("continuous", 500.0, 300, replicas=3, router=router, horizon_s=1.0, max_queue_len=20))
        assert res.summary["num_requests"] > 0


def _lose_request_1(monkeypatch) -> None:
    """Make the engine drop request 1 on arrival: never queued, never rejected."""
    from batchsim.sim.engine import Replica

    enqueue = Replica.enqueue

    def lossy(self, seq):
        if seq.rid == 1:
            seq.replica = self.index
            return None
        return enqueue(self, seq)

    monkeypatch.setattr(Replica, "enqueue", lossy)


def test_the_conservation_check_catches_a_lost_request(monkeypatch):
    _lose_request_1(monkeypatch)
    with pytest.raises((AssertionError, RuntimeError)):
        run(dict(chat("continuous", 10.0, 3), engine="python"))  # (the fault is in the Python engine)


def test_the_runner_refuses_a_run_that_loses_a_request(monkeypatch):
    _lose_request_1(monkeypatch)
    sc = scenario_from_dict(dict(chat("continuous", 10.0, 3), engine="python"))
    with pytest.raises(RuntimeError, match="conservation"):
        simulate(sc, build_parts(sc))


def test_the_runner_refuses_a_core_run_that_loses_a_request(monkeypatch):
    """The compiled core's counterpart: a request left unfinished that no replica holds."""
    from batchsim import core

    if core.library() is None:
        pytest.skip(f"no compiled core here: {core.library_error()}")
    run_core = core.run_core

    def lossy(*args, **kwargs):
        ran = run_core(*args, **kwargs)
        ran.requests["status"][1] = "unfinished"  # completed in the run, then lost
        return ran

    monkeypatch.setattr(core, "run_core", lossy)
    sc = scenario_from_dict(dict(chat("continuous", 10.0, 3), engine="core"))
    with pytest.raises(RuntimeError, match="conservation broken: 1 unfinished request"):
        simulate(sc, build_parts(sc))


def test_the_runner_checks_arrived_equals_completed_rejected_unfinished(monkeypatch):
    from batchsim.sim import records

    frame = records.request_frame
    monkeypatch.setattr(runner, "request_frame", lambda seqs: frame(list(seqs)[1:]))  # one request vanishes
    sc = scenario_from_dict(dict(chat("continuous", 10.0, 3), engine="python"))
    with pytest.raises(RuntimeError, match="conservation broken: 3 arrived, 2 recorded"):
        simulate(sc, build_parts(sc))
