"""``batchsim sweep``: latency and throughput against offered load, per policy.

Each swept rate replaces ``workload.arrival.rate`` (a trace that carries its
own arrival times cannot be swept and is an error). Every (policy, rate,
seed) point is an independent :class:`SweepTask` run through
:func:`batchsim.app.workers.run_tasks`; the workload of a (rate, seed) pair is the
same for every policy. With an output folder, finished points are stored under
``OUT/points/`` as they arrive (a killed sweep keeps them, and a rerun simulates
only the missing ones: :mod:`batchsim.app.compare`'s point store); ``sweep.csv``
(one row per policy and rate, mean ± 95% CI over seeds), ``sweep_runs.csv`` (one
row per point) and the report are written at the end, as one set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from batchsim.reports.derive import load_window
from batchsim.reports.runs import ReportInfo
from batchsim.reports.stats import aggregate
from batchsim.reports.tables import csv_frame
from batchsim.reports.sweep import mark_saturation, saturation_points
from batchsim.app.compare import (DEFAULT_POLICIES, RunTask, knob_text, plain, point_key, policy_variants,
                                  points_folder, policy_config, read_point, report_info, run_resumable,
                                  scenario_data, simulate_task, with_seed, write_point)
from batchsim.app.config import Scenario, scenario_from_dict
from batchsim.sim.errors import InputError
from batchsim.sim.measure import DEFAULT_SEEDS
from batchsim.sim.io import write_csv

__all__ = ["SweepResult", "SweepTask", "SweepPoint", "parse_rates", "parse_concurrency", "with_rate", "with_concurrency", "sweep", "sweep_task", "write_sweep",
           "point_warnings"]

_FIRST = ("policy", "rate")
_LOAD = ("offered_output_throughput", "served_output_throughput")


def parse_rates(text: str | Sequence[float]) -> tuple[float, ...]:
    """``"1,2,4"`` (or numbers) -> sorted unique positive rates in req/s."""
    items = [s for s in text.split(",") if s.strip()] if isinstance(text, str) else list(text)
    rates = []
    for s in items:
        try:
            r = float(s)
        except ValueError:
            raise InputError(f"not a number: {s!r} (expected e.g. 1,2,4,8)", "--rates") from None
        if not r > 0 or r == float("inf"):
            raise InputError(f"rates must be positive and finite, got {s!r}", "--rates")
        rates.append(r)
    if not rates:
        raise InputError("give at least one rate, e.g. --rates 1,2,4,8", "--rates")
    return tuple(sorted(set(rates)))


def parse_concurrency(text: str | Sequence[int]) -> tuple[int, ...]:
    """``"1,2,4"`` (or integers) -> sorted unique client counts >= 1."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for s in items:
        if isinstance(s, str) and not s.strip():
            continue
        try:
            n = int(str(s).strip())
        except ValueError:
            raise InputError(f"not an integer: {s!r} (expected e.g. 1,4,16,64)", "--concurrency") from None
        if n < 1 or str(n) != str(s).strip():
            raise InputError(f"client counts must be integers >= 1, got {s!r}", "--concurrency")
        out.append(n)
    if not out:
        raise InputError("give at least one client count, e.g. --concurrency 1,4,16,64", "--concurrency")
    return tuple(sorted(set(out)))


def with_concurrency(scenario: Scenario, clients: int) -> Scenario:
    """The closed-loop scenario with ``workload.arrival.concurrency`` set to ``clients``."""
    w = scenario.workload
    arrival = w.arrival.model_dump(mode="json", exclude_unset=True) if w.arrival is not None else {}
    if arrival.get("process") != "closed":
        raise InputError(f"--concurrency sweeps a closed loop's clients, but the arrival process is "
                         f"'{arrival.get('process', 'a trace')}'; set workload.arrival: {{process: closed, "
                         "concurrency: N} or sweep --rates", "workload.arrival")
    n = getattr(w, "num_requests", None)
    if n is not None and clients >= n:
        raise InputError(f"{clients} clients for {n} requests would send every request at once (no steady "
                         "state to measure); sweep fewer clients or raise workload.num_requests", "--concurrency")
    data = scenario_data(scenario)
    data.setdefault("workload", {})["arrival"] = {**arrival, "concurrency": int(clients)}
    return scenario_from_dict(data, f"--concurrency {clients}")


def with_rate(scenario: Scenario, rate: float) -> Scenario:
    """The scenario with ``workload.arrival.rate`` set to ``rate`` (req/s)."""
    w = scenario.workload
    if w.trace_has_arrivals:
        raise InputError(f"the trace (format '{w.trace.format}') supplies its own arrival times, so there "
                         "is no arrival rate to sweep; use a synthetic arrival process, a 'lengths' trace, "
                         "or a trace's speedup", "workload.trace")
    arrival = w.arrival.model_dump(mode="json", exclude_unset=True)
    if "rate" not in type(w.arrival).model_fields:
        raise InputError(f"arrival process '{arrival.get('process')}' has no single rate to sweep "
                         "(use poisson, gamma, constant, diurnal or empirical)", "workload.arrival")
    data = scenario_data(scenario)
    data.setdefault("workload", {})["arrival"] = {**arrival, "rate": float(rate)}
    return scenario_from_dict(data, f"--rates {rate:g}")


@dataclass(frozen=True)
class SweepTask:
    """One (policy, rate, seed) point: plain data, so it pickles."""

    run: RunTask
    rate: float


@dataclass(frozen=True)
class SweepPoint:
    """What a sweep worker sends back: one CSV row and the run's facts."""

    row: dict
    meta: dict


def sweep_task(task: SweepTask) -> SweepPoint:
    """The sweep worker: summary metrics plus the load-window rates of one point."""
    result, meta = simulate_task(task.run)
    summary = {k: v for k, v in result.summary.items() if k != "policy"}
    row = {"policy": task.run.label, "rate": task.rate, "seed_index": task.run.seed_index,
           **load_window(result.requests, result.itl), **summary}
    return SweepPoint(row, meta)


@dataclass
class SweepResult:
    """A finished sweep: one row per (policy, rate), saturation points, header."""

    frame: pd.DataFrame
    policies: tuple[str, ...]
    saturation: dict[str, float | None]
    info: ReportInfo
    policy_knobs: list[str]  # one "name(knob=value, ...)" line per policy
    runs: pd.DataFrame | None = None  # one row per (policy, rate, seed) point, in task order
    simulated: int = 0  # points simulated by this call
    reused: int = 0  # points read back from points_dir
    points_dir: Path | None = None  # where finished points are stored (None: nowhere)


def _aggregate(rows: list[dict], names: Sequence[str], rates: Sequence[float], seeds: int) -> pd.DataFrame:
    out = []
    for p in names:
        for r in rates:
            group = [x for x in rows if x["policy"] == p and x["rate"] == r]
            rest = [{k: v for k, v in x.items() if k not in ("policy", "rate", "seed_index")} for x in group]
            stats = rest[0] if seeds == 1 else {"seeds": seeds, **aggregate(rest)}
            out.append({"policy": p, "rate": r, **stats})
    frame = mark_saturation(pd.DataFrame(out))
    lead = [c for c in (*_FIRST, "seeds", *_LOAD, "served_ratio", "saturated") if c in frame]
    return frame[lead + [c for c in frame.columns if c not in lead]]


def sweep(scenario: Scenario, rates: Sequence[float] | None, policies: Sequence[str] = DEFAULT_POLICIES,
          seeds: int = DEFAULT_SEEDS, base_dir: str | Path | None = None, executor: str = "local",
          workers: int | None = None, out_dir: str | Path | None = None,
          show_progress: bool | None = None,
          task_fn: Callable[[SweepTask], SweepPoint] = sweep_task,
          concurrency: Sequence[int] | None = None) -> SweepResult:
    """Run every (policy, rate, seed); aggregate over seeds and mark saturation.

    With ``concurrency`` instead of ``rates`` the swept load is a closed loop's client count
    (the frame's ``concurrency`` column; saturation is then where throughput levels off:
    batchsim.reports.sweep.mark_saturation)."""
    if seeds < 1:
        raise InputError(f"must be at least 1, got {seeds}", "--seeds")
    if (rates is None) == (concurrency is None):
        raise InputError("give the loads to sweep: --rates or --concurrency (one of them)", "--rates")
    closed = concurrency is not None
    rates = parse_concurrency(concurrency) if closed else parse_rates(rates)
    pairs = policy_variants(scenario, policies)
    names = [p for p, _ in pairs]
    load = with_concurrency if closed else with_rate
    base = str(base_dir) if base_dir is not None else None
    tasks, knobs = [], []
    for p, variant in pairs:
        knobs.append(policy_config(variant) if task_fn is sweep_task else dict(variant.policy))
        for r in rates:
            rated = load(variant, r)
            tasks += [SweepTask(RunTask(scenario_data(with_seed(rated, i)), base, p, i, False), r)
                      for i in range(seeds)]
    store = points_folder(out_dir)
    keys = [point_key("sweep", t.run.scenario, t.run.base_dir, label=t.run.label, rate=t.rate,
                      seed_index=t.run.seed_index) for t in tasks]  # (the row carries its seed index)

    def read(i: int) -> SweepPoint | None:
        found = read_point(store, keys[i], "sweep")
        return SweepPoint(found[0]["row"], found[0]["meta"]) if found is not None else None

    def keep(i: int, point: SweepPoint) -> SweepPoint:
        if store is None:
            return SweepPoint(plain(point.row), plain(point.meta))
        record, _ = write_point(store, keys[i], {
            "kind": "sweep", "label": tasks[i].run.label, "rate": tasks[i].rate,
            "seed_index": tasks[i].run.seed_index, "scenario": tasks[i].run.scenario,
            "row": point.row, "meta": point.meta})
        return SweepPoint(record["row"], record["meta"])

    points, simulated = run_resumable(task_fn, tasks, store, read, keep, f"sweep {scenario.name}",
                                      lambda p: f"{p.row['policy']} @ {p.row['rate']:g} "
                                                + ("clients" if closed else "req/s"),
                                      executor, workers, show_progress)
    rows = [p.row for p in points]
    metas: dict[str, dict] = {}  # each policy's first point's facts (task order: the same on a resume)
    for p in points:
        metas.setdefault(p.row["policy"], p.meta)
    frame = _aggregate(rows, names, rates, seeds)
    runs = pd.DataFrame(rows)
    if closed:  # (the swept load is a client count: say so in every table)
        frame, runs = (f.rename(columns={"rate": "concurrency"}) for f in (frame, runs))
        frame = mark_saturation(frame)  # (by the closed loop's rule)
    ordered = [metas.get(p, {}) for p in names]
    info = report_info(scenario, ordered, seeds, "sweep")
    return SweepResult(frame, names, saturation_points(frame), info,
                       [knob_text(k, m) for k, m in zip(knobs, ordered)], runs=runs,
                       simulated=simulated, reused=len(tasks) - simulated, points_dir=store)


def point_warnings(frame: pd.DataFrame) -> list[str]:
    """``warning: <policy> @ <rate> req/s: <text>`` for every summary warning of every point."""
    lines = []
    for r in frame.to_dict(orient="records"):
        ws = r.get("warnings")
        at = f"{r['rate']:g} req/s" if "rate" in r else f"{r['concurrency']:g} clients"
        for w in ws if isinstance(ws, (list, tuple)) else ():
            lines.append(f"warning: {r['policy']} @ {at}: {w}")
    return list(dict.fromkeys(lines))


def write_sweep(result: SweepResult, out_dir: str | Path) -> dict[str, Path]:
    """Write sweep.csv, sweep_runs.csv (when the result has its points), sweep.png and
    report.html as one set (batchsim.sim.io.write_set; ``points/`` is kept)."""
    from batchsim.reports.report import write_sweep_report

    extra = {}
    if result.runs is not None:
        runs = csv_frame(result.runs)
        extra["sweep_runs.csv"] = lambda p: write_csv(p, runs)
    return write_sweep_report(out_dir, result.frame, result.policies, result.info, result.policy_knobs,
                              extra_files=extra)
