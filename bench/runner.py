"""Run benchmark cases one at a time, each in a fresh child process with a budget.

A case runs in ``python -m bench.child`` with one thread per numeric library
(``OMP_NUM_THREADS=1`` and friends), so a simulation uses one core, and the
cases run sequentially. The parent polls the child's resident set: past the
time budget it asks the child to report its progress (SIGTERM) and records
``"timeout"``; past the memory budget it kills it and records ``"memory"``.
A suite writes its result file after every case, so an interrupted run
keeps what it measured.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from bench.child import CALIBRATION_VERSION
from bench.scenarios import (HARDWARE, LOADS, MODEL, OUTPUT_TOKENS, PROMPT_TOKENS,
                             SATURATION_RPS, BenchCase)

__all__ = ["ROOT", "SCHEMA", "Limits", "run_case", "run_suite", "new_document", "write_json",
           "code_hash"]

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = 1
_CODE_DIRS = ("batchsim",)
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


@dataclass(frozen=True)
class Limits:
    """The budget of one case."""

    timeout_s: float = 300.0
    mem_limit_mb: float = 6000.0
    grace_s: float = 60.0  # time a timed-out child gets to write its progress


def code_hash(root: Path = ROOT) -> str:
    """A short hash of the simulator's sources, so a result says which code it timed.

    NOTE: the engine is edited while benchmarks run; the commit alone would
    not say what a working tree held when a case started.
    """
    h = hashlib.sha1()
    for d in _CODE_DIRS:
        for p in sorted((root / d).rglob("*.py")):
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:12]


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def _child_env() -> dict:
    env = dict(os.environ, PYTHONHASHSEED="0")
    env.update({v: "1" for v in _THREAD_VARS})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _wait(proc: subprocess.Popen, limits: Limits) -> tuple[str | None, float]:
    """Wait for the child within the limits: (why it was stopped or None, polled peak RSS)."""
    start, peak = time.monotonic(), 0.0
    while True:
        try:
            proc.wait(timeout=0.25)
            return None, peak
        except subprocess.TimeoutExpired:
            pass
        peak = max(peak, _rss_mb(proc.pid))
        if peak > limits.mem_limit_mb:
            proc.kill()
            proc.wait()
            return "memory", peak
        if time.monotonic() - start > limits.timeout_s:
            proc.terminate()
            try:
                proc.wait(timeout=limits.grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return "timeout", peak


def _derive(r: dict, size: int) -> dict:
    """Rates from the raw measurements; a timeout's rates come from its progress."""
    if r["status"] == "ok":
        r["req_per_s"] = size / r["wall_s"]
        r["steps_per_s"] = r["steps"] / r["wall_s"]
        r["ratio"] = r["cpu_s"] / r["calibration_cpu_s"]
    elif r["status"] == "timeout" and r.get("progress") and r.get("elapsed_s"):
        p, el = r["progress"], r["elapsed_s"]
        r["steps"] = p["steps"]
        r["steps_per_s"] = p["steps"] / el
        r["req_per_s"] = p["completed"] / el
        # NOTE: an estimate from the completed fraction; under overload the
        # queue (and so the cost of a step) grows, so it is a lower bound.
        share = size / p["completed"] if p["completed"] else None
        r["est_wall_s"] = el * share if share else None
        if share and r.get("calibration_cpu_s"):
            r["ratio"] = r["elapsed_cpu_s"] * share / r["calibration_cpu_s"]
    return r


def run_case(case: BenchCase, limits: Limits = Limits()) -> dict:
    """Run one case in a child process; a flat result record (status ok|timeout|memory|error)."""
    rec = {"key": case.key, "size": case.size, "policy": case.policy, "load": case.load,
           "replicas": case.replicas, "rate": case.rate, "code": code_hash(),
           "loadavg": list(os.getloadavg())}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        spec, out, err = Path(tmp, "spec.json"), Path(tmp, "result.json"), Path(tmp, "stderr.txt")
        spec.write_text(json.dumps({"scenario": case.scenario()}))
        with err.open("w") as err_file:
            proc = subprocess.Popen([sys.executable, "-m", "bench.child", str(spec), str(out)],
                                    cwd=ROOT, env=_child_env(), stdout=subprocess.DEVNULL,
                                    stderr=err_file)
            stopped, polled_rss = _wait(proc, limits)
        got = json.loads(out.read_text()) if out.is_file() else {}
        stderr_tail = err.read_text(errors="replace")[-2000:]
    if stopped == "memory":
        got = {"status": "memory", "peak_rss_mb": polled_rss,
               "error": f"RSS {polled_rss:.0f} MiB passed the {limits.mem_limit_mb:.0f} MiB limit"}
    elif stopped == "timeout":
        got = dict(got, status="timeout")
    elif proc.returncode != 0 or not got:
        got = {"status": "error", "error": got.get("error") or stderr_tail or f"exit {proc.returncode}"}
    rec.update(got)
    rec["peak_rss_mb"] = max(rec.get("peak_rss_mb", 0.0), polled_rss)
    return _derive(rec, case.size)


def new_document(label: str, limits: Limits) -> dict:
    """The result file's header: what ran, where, under which budget."""
    now = dt.datetime.now(dt.timezone.utc)
    return {
        "schema": SCHEMA,
        "label": label,
        "created": now.isoformat(timespec="seconds"),
        "git": {"commit": _git("rev-parse", "HEAD"),
                "dirty": bool(_git("status", "--porcelain", "--", *_CODE_DIRS)),
                "code": code_hash()},
        "host": {"python": platform.python_version(), "platform": platform.platform(),
                 "cpus": os.cpu_count(), "loadavg_start": list(os.getloadavg())},
        "settings": {"model": MODEL, "hardware": HARDWARE, "prompt_tokens": PROMPT_TOKENS,
                     "output_tokens": OUTPUT_TOKENS, "saturation_rps": SATURATION_RPS,
                     "loads": LOADS, "limits": asdict(limits)},
        "calibration": {"version": CALIBRATION_VERSION, "median_s": None, "median_cpu_s": None},
        "results": [],
    }


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` atomically (a half-written result file would break the next compare)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def run_suite(cases: Sequence[BenchCase], limits: Limits, path: Path, label: str,
              echo: Callable[[str], None] = print) -> dict:
    """Run ``cases`` in order, rewriting ``path`` after each; the finished document."""
    doc = new_document(label, limits)
    for i, case in enumerate(cases, 1):
        echo(f"[{i}/{len(cases)}] {case.key} (rate {case.rate:g} req/s) ...")
        rec = run_case(case, limits)
        doc["results"].append(rec)
        for k in ("calibration_s", "calibration_cpu_s"):
            got = [r[k] for r in doc["results"] if r.get(k)]
            doc["calibration"]["median_" + k[len("calibration_"):]] = statistics.median(got) if got else None
        doc["host"]["loadavg_end"] = list(os.getloadavg())
        write_json(path, doc)
        echo("    " + _line(rec))
    return doc


def _line(r: dict) -> str:
    if r["status"] == "ok":
        return (f"ok: {r['wall_s']:.1f} s, {r['req_per_s']:.0f} req/s, {r['steps_per_s']:.0f} steps/s, "
                f"peak RSS {r['peak_rss_mb']:.0f} MiB")
    if r["status"] == "timeout":
        est = r.get("est_wall_s")
        return (f"timeout after {r.get('elapsed_s', 0):.0f} s, {r.get('steps_per_s', 0):.0f} steps/s"
                + (f", est. {est:.0f} s in all" if est else ""))
    return f"{r['status']}: {r.get('error', '')}".strip()
