"""The user's path, timed whole: ``batchsim run`` with default settings and outputs.

``python -m bench.user_path`` runs ``batchsim run SCENARIO --out DIR`` as its own process for
each (size, policy) of the fixed ShareGPT-like scenarios (bench/scenarios.py, moderate load,
one replica) at default ``measure`` settings, so what is timed is what a user runs: start-up,
workload, simulation, summary and the record files. For each it records the wall seconds,
the CPU seconds and the peak resident set (the child's ``ru_maxrss`` from ``wait4``, which
counts every thread), the output bytes, and the summary's headline numbers, then compares
with the newest earlier result in the same folder (``*-user.json``) by ratio. A case past
``--mem-limit-mb`` (polled) or ``--timeout`` is killed and recorded as such.

``--tree DIR`` runs another checkout's batchsim (``PYTHONPATH=DIR``): the way to time the code
before a change beside the code after it, on the same machine in the same hour.

NOTE: wall seconds on a shared machine drift with its load; the load average is recorded
with every case, and ratios between two results taken back to back are what to read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.runner import code_hash
from bench.scenarios import BenchCase, parse_sizes, size_label

__all__ = ["run_user_case", "main", "render"]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
POLICIES = ("chunked_prefill", "continuous", "static", "dynamic")
SIZES = (10_000, 100_000, 1_000_000)


def _scenario(case: BenchCase) -> dict:
    sc = case.scenario()
    sc.pop("measure")  # (the defaults: what a user runs)
    sc["name"] = f"user-{size_label(case.size)}-{case.policy}"
    return sc


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def run_user_case(case: BenchCase, tree: Path, timeout_s: float, mem_limit_mb: float) -> dict:
    """One whole ``batchsim run`` in a child process; its record."""
    with tempfile.TemporaryDirectory(prefix="batchsim-user-") as tmp:
        path = Path(tmp) / "scenario.yaml"
        path.write_text(yaml.safe_dump(_scenario(case), sort_keys=False))
        out = Path(tmp) / "out"
        env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   MKL_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "batchsim", "run", str(path), "--out", str(out), "--json"]
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        status, polled = "ok", 0.0
        while True:
            pid, code, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            polled = max(polled, _rss_mb(proc.pid))
            elapsed = time.perf_counter() - t0
            if polled > mem_limit_mb or elapsed > timeout_s:
                status = "memory" if polled > mem_limit_mb else "timeout"
                proc.send_signal(signal.SIGKILL)
                pid, code, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        stdout = proc.stdout.read().decode() if proc.stdout else ""
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        rec = {"key": f"{size_label(case.size)}/{case.policy}", "size": case.size, "policy": case.policy,
               "rate": case.rate, "status": status, "wall_s": round(wall, 3),
               "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
               "peak_rss_mb": round(max(usage.ru_maxrss / 1024.0, polled), 1), "load_avg": round(load, 2)}
        if status == "ok" and os.waitstatus_to_exitcode(code) != 0:
            rec.update(status="error", error=(stderr.strip().splitlines() or ["?"])[-1][:300])
        if status == "ok" and rec["status"] == "ok":
            files = {p.name: p.stat().st_size for p in sorted(out.iterdir())} if out.is_dir() else {}
            summary = json.loads(stdout)
            rec["files"] = files
            rec["summary"] = {k: summary.get(k) for k in ("completed", "num_steps", "median_ttft_ms", "p99_itl_ms",
                                                          "output_throughput", "engine")}
        return rec


def _newest(folder: Path, exclude: Path) -> Path | None:
    found = sorted((p for p in folder.glob("*-user.json") if p != exclude), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def render(doc: dict, previous: dict | None) -> str:
    lines = [f"# Whole-process `batchsim run`: {doc['label']}", "",
             f"Created {doc['created']}; tree {doc['tree']}, code {doc['code']}; Python "
             f"{doc['python']} on {doc['cpus']} CPUs. Default settings and outputs "
             "(`measure` unset), moderate load (0.5x saturation), one replica, "
             "ShareGPT-like lengths (bench/scenarios.py).", "",
             "| case | status | wall s | CPU s | peak RSS MiB | output MiB | steps | load avg |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in doc["cases"]:
        files, steps = r.get("files"), (r.get("summary") or {}).get("num_steps")
        mib = f"{sum(files.values()) / 2**20:,.0f}" if files else "-"
        lines.append(f"| {r['key']} | {r['status']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['peak_rss_mb']:,.0f} | "
                     f"{mib} | {'-' if steps is None else f'{steps:,}'} | {r['load_avg']:.2f} |")
    if previous is not None:
        before = {r["key"]: r for r in previous["cases"]}
        lines += ["", f"Compared with {previous['label']} (tree {previous['tree']}):", "",
                  "| case | wall before | wall now | ratio | RSS before MiB | RSS now MiB | ratio |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in doc["cases"]:
            b = before.get(r["key"])
            if b is None:
                continue
            tag = lambda x: "" if x["status"] == "ok" else f" ({x['status']})"  # noqa: E731
            lines.append(f"| {r['key']} | {b['wall_s']:.1f}{tag(b)} | {r['wall_s']:.1f}{tag(r)} | "
                         f"{r['wall_s'] / b['wall_s']:.2f} | {b['peak_rss_mb']:,.0f}{tag(b)} | "
                         f"{r['peak_rss_mb']:,.0f}{tag(r)} | {r['peak_rss_mb'] / b['peak_rss_mb']:.2f} |")
        lines += ["", "A case marked (memory) or (timeout) was killed there: its figures are lower bounds."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.user_path", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10k,100k,1M")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--tree", type=Path, default=ROOT, help="checkout whose batchsim runs (PYTHONPATH)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--label", default=None)
    ap.add_argument("--compare", type=Path, default=None, help="result to compare with (default: newest *-user.json)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--mem-limit-mb", type=float, default=12_000.0)
    a = ap.parse_args(argv)
    try:
        sizes = parse_sizes(a.sizes)
    except ValueError as e:
        print(f"error: --sizes: {e}", file=sys.stderr)
        return 2
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        print(f"error: --policies: unknown {', '.join(bad)}; expected some of {', '.join(POLICIES)}", file=sys.stderr)
        return 2
    label = a.label or dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = a.out / f"{label}-user.json"
    previous_path = a.compare or _newest(a.out, path)
    doc = {"label": label, "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "tree": str(a.tree), "code": code_hash(a.tree), "python": sys.version.split()[0],
           "cpus": os.cpu_count(), "cases": []}
    a.out.mkdir(parents=True, exist_ok=True)
    for size in sizes:
        for policy in policies:
            rec = run_user_case(BenchCase(size, policy, "moderate", 1), a.tree, a.timeout, a.mem_limit_mb)
            doc["cases"].append(rec)
            print(f"{rec['key']}: {rec['status']} {rec['wall_s']:.1f} s, {rec['peak_rss_mb']:,.0f} MiB", flush=True)
            path.write_text(json.dumps(doc, indent=2) + "\n")
    previous = json.loads(previous_path.read_text()) if previous_path and previous_path.is_file() else None
    text = render(doc, previous)
    path.with_suffix(".md").write_text(text)
    print("\n" + text)
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
