"""The plan worker: one configuration's capacity search, one stored point at a time.

A *point* is one simulation of a configuration at one arrival rate
(``workload.arrival.rate``) with a horizon that makes overloaded points end
early. :func:`search_config` is the task :func:`batchsim.app.workers.run_tasks`
runs (module level and fed plain data, so process pools and Ray can ship
it): it builds the configuration's parts, reports "does not fit" when the
KV cache has no room, estimates a start rate from the cost model, and runs
:func:`batchsim.app.capacity.search.search`, reading and writing points under
``DIR/points/<hash>.json`` as it goes.

The hash covers the point's whole scenario (rate and horizon included), the
batchsim version and a format number, so a stored point is exactly the
simulation a rerun would do. It leaves out the SLO: a rerun with another SLO
reuses every point its search revisits.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from batchsim.app.config import Scenario, scenario_from_dict
from batchsim.sim.errors import InputError
from batchsim.sim.io import write_json
from batchsim.app.capacity.grid import PlanConfig
from batchsim.app.capacity.search import MIN_REQUESTS, NOT_EVALUABLE, REFUSED, search
from batchsim.sim.metrics import rejections_by_kind

__all__ = ["ConfigTask", "ConfigOutcome", "point_key", "point_scenario", "queue_metrics", "search_config",
           "HORIZON_SPANS", "HORIZON_DRAINS", "ESTIMATE_BATCH", "POINT_FORMAT"]

# A point's horizon: HORIZON_SPANS x the arrival span plus HORIZON_DRAINS x the
# time the longest request takes alone. A replica that keeps up finishes long
# before; an overloaded one is cut off there and fails with unfinished requests.
HORIZON_SPANS = 2.0
HORIZON_DRAINS = 10.0
ESTIMATE_BATCH = 16  # the start rate assumes this many sequences decode together
POINT_FORMAT = 2  # bump when a point's meaning changes (invalidates stored points)
# 2: null latencies (not 0.0) when nothing was measured; all_rejected_by_reason


@dataclass(frozen=True)
class ConfigTask:
    """One configuration's whole capacity search: plain data, so it pickles."""

    config: PlanConfig
    base_dir: str | None
    slos: tuple[tuple[str, float], ...]
    tol: float
    points_dir: str | None
    min_requests: int = MIN_REQUESTS
    allow_rejections: bool = False


@dataclass
class ConfigOutcome:
    """What a search task sends back (``new_points``: the points it simulated)."""

    label: str
    status: str  # "ok", "SLO not met", "does not fit", "not evaluable" or "rejects requests"
    capacity: float = 0.0
    metrics: dict | None = None
    limit_rate: float | None = None
    limit_reason: str = ""
    points: int = 0
    mean_output_tokens: float = 0.0
    new_points: dict[str, dict] = field(default_factory=dict)
    reused: int = 0


def point_key(point_scenario: dict, base_dir: str | None) -> str:
    """The hash that names a point's file: its scenario, the version, and (for
    traces) the folder relative paths resolve against."""
    from batchsim import __version__

    trace = bool(point_scenario.get("workload", {}).get("trace"))
    blob = json.dumps({"format": POINT_FORMAT, "batchsim": __version__, "scenario": point_scenario,
                       "base_dir": base_dir if trace else None}, sort_keys=True, allow_nan=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]


def queue_metrics(requests: pd.DataFrame, warmup_s: float = 0.0, cooldown_s: float = 0.0) -> dict:
    """Queueing delay (first admission - arrival, ms) of the completed requests
    in the measured window: mean, median, p90, p99 and max (None when there are none)."""
    names = ("mean", "median", "p90", "p99", "max")
    if requests.empty:
        return {f"{n}_queue_ms": None for n in names}
    hi = requests["arrival"].max() - cooldown_s
    win = requests[(requests["arrival"] >= warmup_s) & (requests["arrival"] <= hi)
                   & (requests["status"] == "completed")]
    q = ((win["admitted"] - win["arrival"]).to_numpy(dtype=float) * 1000.0)
    q = q[~np.isnan(q)]
    if not len(q):
        return {f"{n}_queue_ms": None for n in names}
    vals = (q.mean(), np.percentile(q, 50), np.percentile(q, 90), np.percentile(q, 99), q.max())
    return {f"{n}_queue_ms": float(v) for n, v in zip(names, vals)}


def _policy_limits(scenario: Scenario):
    """The policy's config and the limits that size its activation reserve
    (the runner's own rule, so "does not fit" here is exactly the InputError a
    run of this configuration would raise)."""
    from batchsim import policies
    from batchsim.app.runner import kv_limits

    cfg = policies.create_policy(scenario.policy).config
    return cfg, kv_limits(cfg)


def _solo_seconds(cost, prompt: float, output: float, batch: int = 1) -> float:
    """Seconds to serve one request of these lengths when ``batch`` decode together."""
    from batchsim.sim.types import StepShape

    p, o = max(1, int(round(prompt))), max(1, int(round(output)))
    prefill = cost.price(StepShape.of([(p, 0)])).seconds
    step = cost.price(StepShape.of([(1, p + o // 2)] * batch)).seconds
    return prefill + (o - 1) * step / batch


def _estimates(scenario: Scenario, parts, limits: dict) -> dict:
    """Start rate, drain time and workload facts of one configuration (deterministic)."""
    wl = parts.workload
    prompt, output = np.asarray(wl.prompt_tokens, float), np.asarray(wl.output_tokens, float)
    batch = max(1, min(ESTIMATE_BATCH, int(limits.get("max_num_seqs", ESTIMATE_BATCH))))
    start = 1.0 / _solo_seconds(parts.cost, prompt.mean(), output.mean(), batch)
    drain = HORIZON_DRAINS * _solo_seconds(parts.cost, prompt.max(), output.max())
    w = scenario.workload
    fixed_span = w.duration_s if (w.num_requests is None and w.duration_s is not None and w.trace is None) else None
    return {"start": start, "drain": drain, "n": len(wl), "span": fixed_span,
            "mean_output_tokens": float(output.mean())}


def point_scenario(config: Scenario, rate: float, est: dict) -> dict:
    """The scenario of one point: the config at ``rate`` with the plan's horizon."""
    from batchsim.app.compare import scenario_data
    from batchsim.app.sweep import with_rate

    data = scenario_data(with_rate(config, rate))
    span = est["span"] if est["span"] is not None else est["n"] / rate
    data["horizon_s"] = float(f"{HORIZON_SPANS * span + est['drain']:.6g}")
    return data


def _load_point(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))["metrics"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, or damaged by something other than our atomic writes: recompute


def _simulate_point(data: dict, base_dir: str | None) -> dict:
    """One point's metrics: the summary, queueing delays and whole-run counts."""
    from batchsim.app.runner import run_scenario

    sc = scenario_from_dict(data, "plan point")
    result = run_scenario(sc, Path(base_dir) if base_dir else None)
    req = result.requests
    # NOTE: None (a null latency) is kept: a missing SLO metric is "not evaluable", not a pass
    metrics = {k: v for k, v in result.summary.items()
               if v is None and k != "engine_reason" or isinstance(v, (int, float)) and not isinstance(v, bool)}
    metrics.update(queue_metrics(req, sc.measure.warmup_s, sc.measure.cooldown_s))
    rejected = req[req["status"] == "rejected"]
    metrics["all_rejected"] = int(len(rejected))
    metrics["all_rejected_by_reason"] = rejections_by_kind(rejected["reason"].tolist())
    metrics["all_unfinished"] = int((req["status"] == "unfinished").sum())
    return metrics


def search_config(task: ConfigTask) -> ConfigOutcome:
    """The plan worker: search one configuration's capacity, storing each point."""
    from batchsim.app.runner import build_parts

    cfg = task.config
    scenario = scenario_from_dict(cfg.scenario, cfg.label)
    parts = build_parts(scenario, Path(task.base_dir) if task.base_dir else None)
    policy_cfg, limits = _policy_limits(scenario)
    try:
        parts.kv_tokens(policy_cfg.gpu_memory_utilization, **limits)
    except InputError as e:
        return ConfigOutcome(cfg.label, "does not fit", limit_reason=e.message)
    est = _estimates(scenario, parts, limits)
    out = ConfigOutcome(cfg.label, "ok", mean_output_tokens=est["mean_output_tokens"])
    store = Path(task.points_dir) if task.points_dir else None

    def evaluate(rate: float) -> dict:
        data = point_scenario(scenario, rate, est)
        key = point_key(data, task.base_dir)
        cached = _load_point(store / f"{key}.json") if store else None
        if cached is not None:
            out.reused += 1
            return cached
        record = {"key": key, "config": cfg.label, "rate": rate, "scenario": data,
                  "metrics": _simulate_point(data, task.base_dir)}
        if store:
            write_json(store / f"{key}.json", record)
        out.new_points[key] = record
        return record["metrics"]

    found = search(evaluate, dict(task.slos), est["start"], task.tol, min_requests=task.min_requests,
                   allow_rejections=task.allow_rejections)
    out.capacity, out.metrics = found.capacity, found.metrics
    out.limit_rate, out.limit_reason = found.limit_rate, found.limit_reason
    out.points = len({r for r, _ in found.trail})
    if found.status == NOT_EVALUABLE:
        out.status = "not evaluable"
    elif found.status == REFUSED:
        out.status = "rejects requests"
    elif found.capacity <= 0:
        out.status = "SLO not met"
    return out
