"""One benchmark case in a fresh process: calibrate, build, simulate, measure.

``python -m bench.child SPEC.json RESULT.json`` is what :mod:`bench.runner`
starts for every case, so each case has its own peak RSS (``VmHWM``) and
no case warms caches for the next. The process times a fixed pure-Python
calibration loop before and after the run; ``cpu / calibration cpu`` is the
number compared between result files, because the machine is shared and
its absolute speed drifts with whatever else runs.

NOTE: the ratio uses CPU seconds, not wall seconds. On this 2-core machine
at a load average of ~3, a process waits for a core a varying share of the
time: a short calibration loop's wall time swung 3.7x between cases of one
run (0.031-0.116 s) while its CPU time stayed within 2%. Waiting is not the
simulator's cost; the CPU-time ratio still absorbs clock speed and cache
or SMT sharing. Wall seconds are reported as measured.

If the parent's timeout fires it sends SIGTERM; the handler writes how far
the run got (steps, arrived and completed requests, simulated time) so a
timed-out case still reports a rate, then exits.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

__all__ = ["CALIBRATION_VERSION", "calibration_work", "time_calibration", "peak_rss_mb", "main"]

CALIBRATION_VERSION = 2
"""Bump when :func:`calibration_work` changes: ratios across versions don't compare."""


def calibration_work(n: int = 500_000) -> int:
    """A fixed pure-Python workload (dict updates, integer arithmetic, a loop).

    NOTE: it mimics the simulator's hot path (interpreted loops over dicts),
    not numpy; never change it without bumping :data:`CALIBRATION_VERSION`.
    """
    table: dict[int, int] = {}
    acc = 0
    for i in range(n):
        k = i & 1023
        table[k] = table.get(k, 0) + i
        acc += (i * 7) % 13
    return acc + len(table)


def time_calibration(repeats: int = 3) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of ``repeats`` runs of :func:`calibration_work`."""
    out = []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        calibration_work()
        out.append((time.perf_counter() - t, time.process_time() - c))
    return out


def _calibration(runs: list[tuple[float, float]]) -> dict:
    return {"calibration_runs": runs, "calibration_s": statistics.median(w for w, _ in runs),
            "calibration_cpu_s": statistics.median(c for _, c in runs)}


def _status_kb(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM; ru_maxrss where /proc is missing), MiB."""
    kb = _status_kb("VmHWM")
    if kb is None:
        import resource
        kb = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return kb / 1024


def _write(path: str, data: dict) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _progress() -> dict:
    """How far the simulation got, found by walking the live objects (only on timeout)."""
    from batchsim.sim.aggregate import StepTotals
    from batchsim.sim.engine import Cluster
    from batchsim.sim.state import COMPLETED

    got = {"steps": 0, "arrived": 0, "completed": 0, "sim_s": 0.0}
    for obj in gc.get_objects():
        if isinstance(obj, StepTotals):  # (every run's steps pass through one)
            got["steps"] += len(obj)
        elif isinstance(obj, Cluster):
            got["arrived"] += len(obj.requests)
            got["completed"] += sum(1 for s in obj.requests if s.status == COMPLETED)
            got["sim_s"] = max(got["sim_s"], float(obj.env.now))
    from batchsim import core

    ran = core.progress()  # the compiled core keeps its state in C: ask it
    if ran is not None:
        got["arrived"] += ran["arrived"]
        got["completed"] += ran["completed"]
        got["sim_s"] = max(got["sim_s"], ran["sim_s"])
    return got


def _on_timeout(out: str, t0: list[float], calibration: list[tuple[float, float]]):
    def handler(_signum, _frame):
        wall, cpu = (time.perf_counter() - t0[0], time.process_time() - t0[1]) if t0 else (0.0, 0.0)
        # NOTE: time the loop again at the cutoff, as a finished case does after
        # its run: the VM's speed can change during a long case, and a ratio
        # over the loop timed only before the run would carry that change
        runs = calibration + time_calibration(3)
        _write(out, {"status": "timeout", "elapsed_s": wall, "elapsed_cpu_s": cpu,
                     "progress": _progress(), "peak_rss_mb": peak_rss_mb(), **_calibration(runs)})
        os._exit(0)
    return handler


def run(spec: dict, out: str) -> dict:
    """Calibrate, then build and simulate ``spec["scenario"]``; the measurements."""
    from batchsim.app.config import scenario_from_dict
    from batchsim.app.runner import build_parts, simulate

    import_rss = peak_rss_mb()
    calibration = time_calibration(3)
    t0: list[float] = []
    signal.signal(signal.SIGTERM, _on_timeout(out, t0, calibration))
    t0 += [time.perf_counter(), time.process_time()]
    scenario = scenario_from_dict(spec["scenario"], "bench")
    parts = build_parts(scenario)
    t1 = time.perf_counter()
    result = simulate(scenario, parts)
    t2 = time.perf_counter()
    cpu = time.process_time() - t0[1]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finished: let the parent wait for the file
    calibration += time_calibration(3)
    summary = result.summary
    return {
        "status": "ok", "build_s": t1 - t0[0], "sim_s": t2 - t1, "wall_s": t2 - t0[0], "cpu_s": cpu,
        "requests": len(parts.workload), "completed": int(summary.get("completed", 0)),
        "steps": int(summary.get("num_steps", len(result.steps))),
        "sim_duration_s": float(summary.get("duration_s", 0.0)),
        "peak_rss_mb": peak_rss_mb(), "import_rss_mb": import_rss, **_calibration(calibration),
    }


def main(argv: list[str]) -> int:
    """Entry point: ``SPEC.json RESULT.json``; exit 1 (and an error record) on failure."""
    spec_path, out = argv
    spec = json.loads(Path(spec_path).read_text())
    try:
        _write(out, run(spec, out))
    except Exception as err:  # recorded, not raised: one broken case must not stop a suite
        _write(out, {"status": "error", "error": f"{type(err).__name__}: {err}"})
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
