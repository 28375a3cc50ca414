"""Test doubles for engine tests: a constant-time cost model, a runner, and the
small KV-tight scenarios (and a calibrated-like profile) several test files share."""

from __future__ import annotations

import numpy as np
import simpy

from batchsim.calibrate.hardware import HardwareProfile, load_hardware
from batchsim.sim.engine import Cluster, Replica
from batchsim.sim.kv import PagedKVCache
from batchsim.sim.metrics import RunTotals, summarize
from batchsim.sim.aggregate import StepTotals
from batchsim.sim.itl import TokenSteps
from batchsim.sim.records import FrameSteps, StepStream, request_frame
from batchsim.sim.router import make_router
from batchsim.sim.types import StepCost, StepShape, Workload


class ConstantCost:
    """Every step takes ``seconds``; FLOPs = tokens, bytes = rows."""

    peak_flops = 1e12
    peak_bandwidth = 1e12

    def __init__(self, seconds: float = 1.0, per_token: float = 0.0) -> None:
        self.seconds, self.per_token = seconds, per_token

    def price(self, shape: StepShape, breakdown: bool = False) -> StepCost:
        t = self.seconds + self.per_token * float(shape.q.sum())
        return StepCost(seconds=t, flops=float(shape.q.sum()), bytes=float(shape.num_rows),
                        memory_s=t)


def workload(arrivals, prompts, outputs) -> Workload:
    return Workload(arrival=np.asarray(arrivals, dtype=float),
                    prompt_tokens=np.asarray(prompts, dtype=np.int64),
                    output_tokens=np.asarray(outputs, dtype=np.int64))


def run_engine(policy_factory, wl: Workload, cost=None, replicas: int = 1, kv_blocks: int = 1000,
               block_size: int = 16, max_model_len: int = 100_000, router: str = "round_robin",
               horizon: float | None = None, seed: int = 0, kv_factory=None, max_queue_len: int | None = None):
    """Run the engine directly; returns (requests df, steps df, itl df: one row per gap, cluster);
    the cluster carries the run's step totals and gap records for :func:`summary_of`."""
    from batchsim.app.runner import _itl_records

    env = simpy.Environment()
    frame = FrameSteps()
    steps = StepStream(StepTotals(replicas), frame)
    cost = cost or ConstantCost()
    kv_factory = kv_factory or (lambda: PagedKVCache(kv_blocks, block_size))
    reps = [Replica(env, i, policy_factory(), cost, kv_factory(),
                    max_model_len, steps, TokenSteps()) for i in range(replicas)]
    cluster = Cluster(env, reps, make_router(router, np.random.default_rng(seed)), wl, max_queue_len)
    env.run(until=horizon)
    steps.close()
    cluster.step_totals = steps.totals
    cluster.itl_records = _itl_records(reps, cluster.requests, len(wl))
    return request_frame(cluster.requests), frame.frame(), cluster.itl_records.frame(), cluster


def summary_of(req, steps, itl, cluster, policy="test"):
    kv = cluster.replicas[0].kv
    end = float(steps["end"].max()) if len(steps) else 0.0
    totals = RunTotals(replicas=len(cluster.replicas), sim_end=end, peak_flops=1e12,
                       peak_bandwidth=1e12, kv_total_blocks=kv.total_blocks,
                       kv_peak_blocks=max(r.kv.peak_used for r in cluster.replicas))
    return summarize(req, cluster.step_totals, cluster.itl_records, totals, policy)


def _calibrated_like(name: str) -> HardwareProfile:
    """A shipped profile with measured ranges added, so out-of-range counting varies."""
    data = load_hardware(name).model_dump(mode="json")
    for c, eff in data["efficiency"].items():
        eff["measured_range"] = {"tokens": [2, 200], "bytes": [1e5, 3e7]}
    data["calibrated"] = True
    data["provenance"]["calibration"] = {"device": "test", "software": {}, "date": "2025-01-01"}
    data["host_overhead"]["per_decode_step_us"] = 137.5  # decode steps' own host term in every fast path
    return HardwareProfile.model_validate(data)


# -- small scenarios with KV pressure, one per built-in policy -------------------------------------

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


ENGINE_KEYS = ("engine", "engine_reason")  # which engine ran and why: the one thing engines may differ in


def outcome(summary: dict) -> dict:
    """A summary without the keys that say which engine ran (its provenance's ``engine`` too)."""
    out = {k: v for k, v in summary.items() if k not in ENGINE_KEYS}
    if isinstance(out.get("provenance"), dict):
        out["provenance"] = {k: v for k, v in out["provenance"].items() if k != "engine"}
    return out


def written(result, folder) -> dict[str, bytes]:
    """What a run writes (write_outputs' files, the summary without its engine keys) plus its gap
    records, as bytes by name."""
    import json

    from batchsim.app.runner import write_outputs

    write_outputs(result, folder)
    from pathlib import Path

    out = Path(folder)
    # (manifest.json lists the files' sizes: the summary's engine keys differ by engine)
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "manifest.json"}
    files["summary.json"] = json.dumps(outcome(json.loads(files["summary.json"])), sort_keys=True).encode()
    files["itl"] = result.itl.frame().to_csv(index=False).encode()
    return files


def threads_back_to(count: int, within_s: float = 1.0) -> bool:
    """Whether the threads running (``_thread._count()``) are back to ``count`` within
    ``within_s``: a worker that said it is done (a flag, its last touch of the run) still has to
    return from its function."""
    import _thread
    import time

    end = time.monotonic() + within_s
    while _thread._count() > count:
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


class Interrupt(BaseException):
    """What :class:`AlarmInterrupts` raises: like KeyboardInterrupt, not an Exception."""


def _lands_in_project(frame) -> bool:
    """Whether an alarm that fired at ``frame`` stands for a Ctrl-C the code under test must handle.
    Frames are walked outwards: the first frame of the project (``batchsim/``) says yes, after any
    library frames it called (threading, queue, time); the test's own frames (``tests/``: the
    harness, the loop around the run) and pytest's say no. So do weakref callbacks and
    ``__del__``, where Python cannot raise and only reports the exception (then pytest's
    unraisable hook runs inside the run, and an alarm there breaks pytest, not the code under
    test). A "no" leaves the interrupt for the alarm's next tick."""
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if frame.f_code.co_name == "__del__" or name.endswith(("/_weakrefset.py", "/weakref.py")):
            return False
        if "/_pytest/" in name or "/pluggy/" in name or "/tests/" in name:
            return False
        if "/batchsim/" in name:
            return True
        frame = frame.f_back
    return False


class AlarmInterrupts:
    """Ctrl-C stand-ins: once armed, SIGALRM after 10 ms and then every 2 ms raises
    :class:`Interrupt`, ``times`` times (``left`` says how many are still to come), each where it
    lands in the code under test (:func:`_lands_in_project`). POSIX only."""

    def __init__(self) -> None:
        self.left = 0

    def _handler(self, signum, frame) -> None:
        if self.left > 0 and _lands_in_project(frame):
            self.left -= 1
            raise Interrupt()

    def __enter__(self) -> "AlarmInterrupts":
        import signal

        self._old = signal.signal(signal.SIGALRM, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._old)

    def arm(self, times: int = 2) -> None:
        import signal

        self.left = times
        signal.setitimer(signal.ITIMER_REAL, 0.01, 0.002)

    def disarm(self) -> None:
        import signal

        self.left = 0
        signal.setitimer(signal.ITIMER_REAL, 0)
