"""The plan worker: one configuration's capacity search, one stored point at a time.

A *point* is one simulation of a configuration at one arrival rate
(``workload.arrival.rate``) with a horizon that makes overloaded points end
early. :func:`search_config` is the task :func:`batchsim.app.workers.run_tasks`
runs (module level and fed plain data, so process pools and Ray can ship
it): it builds the configuration's parts, reports "does not fit" when the
KV cache has no room, estimates a start rate from the cost model, and runs
:func:`batchsim.app.capacity.search.search`, reading and writing points under
``DIR/points/<hash>.json`` as it goes.

The hash covers the point's whole scenario (rate, seed and horizon included),
the batchsim version and a format number, so a stored point is exactly the
simulation a rerun would do. It leaves out the SLO: a rerun with another SLO
reuses every point its search revisits.

Seeds: a rate is judged on seeds ``seed + 0 .. k - 1`` pooled
(:func:`pool`: each metric's mean and 95% interval), the same seeds for every
configuration and rate (common random numbers: the configurations are compared
on the same requests). ``k`` starts at ``ConfigTask.seeds`` and grows one seed
at a time until every SLO metric's 95% interval is within ``ci_width`` of its
mean, or ``max_seeds`` is reached (then the row says the interval is wider
than asked). The rule reads the SLO metrics' names, not their limits, so the
capacity stays monotone in the limits. Three searches share the points: the
decision (every SLO met at its interval's upper end), the estimate (at the
mean) and the optimistic end (at the lower end); their capacities are the low
end, the estimate and the high end of the capacity's interval.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from batchsim.app.config import Scenario, scenario_from_dict
from batchsim.sim.errors import InputError
from batchsim.sim.io import write_json
from batchsim.app.capacity.grid import PlanConfig
from batchsim.app.capacity.search import BURST, FAIL, MIN_REQUESTS, NOT_EVALUABLE, REFUSED, judge_gates, search
from batchsim.sim.measure import DEFAULT_CI_WIDTH, DEFAULT_MAX_SEEDS, DEFAULT_SEEDS, steady_share
from batchsim.sim.metrics import rejections_by_kind

__all__ = ["ConfigTask", "ConfigOutcome", "point_key", "point_scenario", "queue_metrics", "search_config",
           "pool", "binding_metric", "HORIZON_SPANS", "HORIZON_DRAINS", "ESTIMATE_BATCH", "POINT_FORMAT",
           "DEFAULT_SEEDS", "DEFAULT_MAX_SEEDS", "DEFAULT_CI_WIDTH"]

# A point's horizon: HORIZON_SPANS x the arrival span plus HORIZON_DRAINS x the
# time the longest request takes alone. A replica that keeps up finishes long
# before; an overloaded one is cut off there and fails with unfinished requests.
HORIZON_SPANS = 2.0
HORIZON_DRAINS = 10.0
ESTIMATE_BATCH = 16  # the start rate assumes this many sequences decode together
POINT_FORMAT = 5  # bump when a point's meaning changes (invalidates stored points)
# 2: null latencies (not 0.0) when nothing was measured; all_rejected_by_reason
# 3: facts (effective policy knobs, KV capacity, engine) beside the metrics
# 4: arrival_span_s (an open loop's measured arrivals: a span shorter than their E2E is a burst)
# 5: all_served_share, all_served_output_share (what a rejecting capacity serves)



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
    seeds: int = 1
    max_seeds: int = 1
    ci_width: float = DEFAULT_CI_WIDTH
    max_requests: int | None = None  # the most requests a short point is lengthened to (None: LONGER_CAP x its own)


@dataclass
class ConfigOutcome:
    """What a search task sends back (``new_points``: the points it simulated)."""

    label: str
    status: str  # "ok", "SLO not met", "does not fit", "not evaluable" or "rejects requests"
    capacity: float = 0.0  # the decision: the capacity interval's low end
    metrics: dict | None = None  # pooled over seeds (means, <key>_ci95 half-widths) at ``capacity``
    limit_rate: float | None = None
    limit_reason: str = ""
    points: int = 0  # simulations (seeds x rates) behind the searches: stored points
    mean_output_tokens: float = 0.0
    new_points: dict[str, dict] = field(default_factory=dict)
    reused: int = 0
    estimate: float | None = None  # capacity judged at the means (None with one seed)
    upper: float | None = None  # capacity judged at the lower ends (the interval's high end)
    interval_note: str = ""  # why an end of the interval is missing
    rates: int = 0  # rates tried
    point_scenario: dict | None = None  # the first seed's scenario at ``capacity`` (reproduces the row)
    requests: float = 0.0  # requests per point at ``capacity`` (its seeds' mean: more than the workload's when lengthened)
    lengthened: int = 0  # rates whose points ran with more requests than the workload's
    longest: int = 0  # the most requests a lengthened point ran
    max_requests: int = 0  # the most a point may be lengthened to (--max-requests or its default)
    steady_share: float | None = None  # the capacity's first seed's span over what a steady state needs


def point_key(point_scenario: dict, base_dir: str | None) -> str:
    """The hash that names a point's file (:func:`batchsim.app.points.point_key`: its scenario,
    the files it reads, the code) and the plan's point format."""
    from batchsim.app.points import point_key as key

    return key(point_scenario, base_dir, kind="plan", format=POINT_FORMAT)


def queue_metrics(requests, warmup_s: float = 0.0, cooldown_s: float = 0.0, warmup_requests: int = 0,
                  cooldown_requests: int = 0) -> dict:
    """Queueing delay (first admission - arrival, ms) of the completed requests
    in the measured window: mean, median, p90, p99 and max (None when there are none); of request
    records, a pandas frame or a batchsim.sim.table.Table."""
    from batchsim.reports.derive import measured_completed
    from batchsim.sim.table import column

    names = ("mean", "median", "p90", "p99", "max")
    if not len(requests):
        return {f"{n}_queue_ms": None for n in names}
    win = measured_completed(requests, warmup_s, cooldown_s, warmup_requests, cooldown_requests)
    q = (column(win, "admitted", float) - column(win, "arrival", float)) * 1000.0
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
    closed = wl.closed is not None
    if closed:  # (a closed loop's clients: start from the batch the estimate assumes)
        start = float(max(1, min(batch, len(wl) - 1)))
    return {"start": start, "drain": drain, "n": len(wl), "span": fixed_span,
            "mean_output_tokens": float(output.mean()), "closed": closed}


def point_scenario(config: Scenario, rate: float, est: dict, requests: int | None = None) -> dict:
    """The scenario of one point: the config at ``rate`` with the plan's horizon (and ``requests``
    requests, when given: a lengthened point, :func:`longer`); for a closed loop
    (``est["closed"]``) ``rate`` is its clients, there is no horizon (its clients wait for
    their responses, so an overloaded point cannot run away: it ends when its requests are done),
    and its measured window leaves out the first and last ``rate`` arrivals (the burst at t=0 and
    the wind-down)."""
    from batchsim.app.compare import scenario_data
    from batchsim.app.sweep import with_concurrency, with_rate

    if est.get("closed"):
        # (its clients all send at t=0 and run out of requests at the end: the window leaves out the
        # first and the last `clients` arrivals, what is measured is the steady state)
        data = scenario_data(with_concurrency(config, int(rate)))
        data["measure"] = {**data.get("measure", {}), "warmup_requests": int(rate), "cooldown_requests": int(rate)}
        return data
    data = scenario_data(with_rate(config, rate))
    if requests is not None:
        data["workload"]["num_requests"] = int(requests)
    span = est["span"] if est["span"] is not None else (requests or est["n"]) / rate
    data["horizon_s"] = float(f"{HORIZON_SPANS * span + est['drain']:.6g}")
    return data


LONGER_CAP = 10
"""A short point is lengthened to at most this many times the workload's requests (``--max-requests``):
a bound the user's request count sets, the same whichever engine runs the points."""

LONGER_MARGIN = 1.1
"""A lengthened point asks for this much more than the span a steady state needs."""

LONGER_STEP = 4
"""One lengthening asks for at most this many times the requests of the run before it ..."""

LONGER_ROUNDS = 4
"""... and a point is lengthened at most this many times (so at most LONGER_STEP ** LONGER_ROUNDS = 256 x
its requests, within the cap): each longer run's own E2E decides the next length, which a run too
short for its tail underestimates, and an overloaded queue's E2E grows with the run, so its share of
a steady state never reaches 1 and only these bounds stop it."""


def _share(metrics: dict) -> float | None:
    """A point's span of measured arrivals over what a steady state needs (sim.measure.steady_share)."""
    return steady_share(metrics.get("arrival_span_s"), metrics.get("median_e2el_ms"), metrics.get("p99_e2el_ms"))


def longer(metrics: dict, n: int, cap: int) -> int | None:
    """The requests a point of ``n`` requests must run for its measured arrivals to span what a
    steady state needs (:func:`~batchsim.sim.measure.steady_share`: SHORT_SPANS median and TAIL_SPANS
    p99 E2E times, with :data:`LONGER_MARGIN`), at most ``cap`` and :data:`LONGER_STEP` x ``n``; None
    when it already does, has no span (a closed loop) or cannot run more. An empty measured window (a
    warm-up longer than the run) asks for twice as many.

    A run whose requests all arrive within a few E2E times cannot show a queue that grows, nor the
    running batch of a steady state: a rate above what the replica sustains still meets the SLOs on
    it (docs/capacity-planning.md, "Long enough points"). The span grows with the requests at a given
    rate, so the point is run again with enough of them, the same rate and seed."""
    if metrics.get("measured_requests") == 0:  # (a warm-up or cool-down longer than the run: twice as long)
        more = min(int(cap), 2 * n)
        return more if more > n else None
    share = _share(metrics)
    if share is None or share >= 1.0:
        return None
    more = min(int(cap), LONGER_STEP * n, math.ceil(n * LONGER_MARGIN / max(share, 1e-9)))
    return more if more > n else None


def _load_point(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))["metrics"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, or damaged by something other than our atomic writes: recompute


def _facts(summary: dict) -> dict:
    """What a point ran with (its summary's provenance): effective policy knobs, KV capacity, engine."""
    prov = summary.get("provenance") or {}
    keep = ("policy", "kv_blocks_per_replica", "block_size", "kv_capacity_tokens_per_replica", "max_model_len",
            "engine", "scenario_hash")
    return {k: prov.get(k) for k in keep if k in prov}


def _simulate_point(data: dict, base_dir: str | None) -> dict:
    """One point's metrics: the summary, queueing delays, whole-run counts and its facts."""
    from batchsim.app.runner import run_scenario

    sc = scenario_from_dict(data, "plan point")
    result = run_scenario(sc, Path(base_dir) if base_dir else None, keep_steps=False)  # (nothing reads them)
    req = result.request_table
    # NOTE: None (a null latency) is kept: a missing SLO metric is "not evaluable", not a pass
    metrics = {k: v for k, v in result.summary.items()
               if v is None and k != "engine_reason" or isinstance(v, (int, float)) and not isinstance(v, bool)}
    m = sc.measure
    metrics.update(queue_metrics(req, m.warmup_s, m.cooldown_s, m.warmup_requests, m.cooldown_requests))
    is_rejected = np.asarray(req["status"] == "rejected")
    rejected = req[is_rejected]
    metrics["all_rejected"] = int(len(rejected))
    # (what the served requests are of all: by count and by output tokens, so a capacity that
    # rejects requests (--allow-rejections) prices only the tokens it serves)
    out = np.asarray(req["output_tokens"], dtype=np.float64)
    total = out.sum()
    metrics["all_served_share"] = float((~is_rejected).mean()) if len(out) else None
    metrics["all_served_output_share"] = float(out[~is_rejected].sum() / total) if total > 0 else None
    metrics["all_rejected_by_reason"] = rejections_by_kind(rejected["reason"].tolist())
    metrics["all_unfinished"] = int((req["status"] == "unfinished").sum())  # (the Table's columns)
    if getattr(sc.workload.arrival, "process", None) == "closed":  # (only an open loop's span is its rate's)
        metrics.pop("arrival_span_s", None)
    metrics["facts"] = _facts(result.summary)
    return metrics


def _rel(metrics: dict, name: str) -> float | None:
    """``name``'s 95% half-width relative to its mean; None without an interval (one seed) or a value."""
    from batchsim.reports.stats import CI_SUFFIX

    value, half = metrics.get(name), metrics.get(name + CI_SUFFIX)
    if value is None or half is None or not np.isfinite(float(half)) or not float(value) > 0:
        return None
    return float(half) / float(value)


def binding_metric(metrics: dict, slos: dict) -> str | None:
    """The SLO metric nearest its limit, judged where the plan decides (the upper end of its
    95% interval, or its value with one seed, / its limit); None when every one is null."""
    from batchsim.app.capacity.search import slo_value

    ratios = {k: v / limit for k, limit in slos.items() if (v := slo_value(metrics, k, "upper")[0]) is not None}
    return max(ratios, key=lambda k: (ratios[k], k)) if ratios else None


def pool(per_seed: list[dict], seed_values: list[int], slos: dict) -> dict:
    """One rate's metrics over its seeds: each numeric metric's mean and ``<key>_ci95``
    (batchsim.reports.stats.aggregate), the seed runs themselves (``per_seed``, judged one
    by one for rejections and thin windows), the binding metric (nearest its limit) with
    its relative half-width, and the widest SLO metric with its relative half-width
    (``widest_ci_rel``: the seeds' sizing rule; None with one seed)."""
    plain = [{k: v for k, v in m.items() if k not in ("facts", "all_rejected_by_reason")} for m in per_seed]
    out = aggregate_seeds(plain)
    out.update(seeds=len(per_seed), seed_values=list(seed_values), per_seed=per_seed,
               facts=per_seed[0].get("facts"))
    name = binding_metric(out, slos)
    out["binding_metric"] = name
    out["binding_ci_rel"] = _rel(out, name) if name else None
    rels = {k: _rel(out, k) for k in slos}
    if len(per_seed) > 1 and rels and all(r is not None for r in rels.values()):
        out["widest_metric"] = max(rels, key=lambda k: (rels[k], k))
        out["widest_ci_rel"] = rels[out["widest_metric"]]
    else:
        out["widest_metric"], out["widest_ci_rel"] = None, None
    return out


def aggregate_seeds(plain: list[dict]) -> dict:
    """:func:`batchsim.reports.stats.aggregate` over two or more seeds; one seed as it is."""
    from batchsim.reports.stats import aggregate

    return aggregate(plain) if len(plain) > 1 else dict(plain[0])


def search_config(task: ConfigTask) -> ConfigOutcome:
    """The plan worker: search one configuration's capacity (and its interval), storing each point."""
    from batchsim.app.compare import with_seed
    from batchsim.app.capacity.search import BOUNDS, FAIL, PASS, judge
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
    slos = dict(task.slos)
    seeded = [scenario]  # seed + i, made as the sizing asks for them

    def run_seed(rate: float, i: int) -> dict:
        while len(seeded) <= i:
            seeded.append(with_seed(scenario, len(seeded)))
        data = point_scenario(seeded[i], rate, est, lengths.get(rate))
        key = point_key(data, task.base_dir)
        out.points += 1
        cached = _load_point(store / f"{key}.json") if store else None
        if cached is not None:
            out.reused += 1
            return cached
        record = {"key": key, "config": cfg.label, "rate": rate, "seed": seeded[i].seed, "scenario": data,
                  "metrics": _simulate_point(data, task.base_dir)}
        if store:
            write_json(store / f"{key}.json", record)
        out.new_points[key] = record
        return record["metrics"]

    pooled: dict[float, dict] = {}
    # (requests per point by rate, where a short first run asked for more: an open loop of a synthetic
    # workload with a request count; a trace's or a duration's requests are what they are)
    lengths: dict[float, int] = {}
    shares: dict[float, float | None] = {}  # (each rate's first seed's share of a steady state, as it ran)
    w = scenario.workload
    lengthen = not est["closed"] and w.trace is None and w.num_requests is not None and w.duration_s is None
    most = task.max_requests if task.max_requests is not None else LONGER_CAP * est["n"]

    def evaluate(rate: float) -> dict:
        """The rate's pooled metrics; seeds are added until every SLO metric's interval is narrow
        enough. NOTE: the rule reads the SLO metrics' names, never their limits, so a point's
        metrics do not depend on the limits and the search stays monotone in them."""
        if rate not in pooled:
            runs: list[dict] = []
            while True:
                runs.append(run_seed(rate, len(runs)))
                # (too short for a steady state: the same rate and seed, longer; again while a longer
                # run's E2E grows with it, within LONGER_ROUNDS, LONGER_STEP and the cap)
                rounds = 0
                while len(runs) == 1 and lengthen and rounds < LONGER_ROUNDS:
                    # (not a point a longer run cannot rescue: requests refused at any load, or
                    # rejected or left unfinished for overload)
                    status, why = judge_gates(runs[0], task.min_requests, task.allow_rejections)
                    if status == REFUSED or (status == FAIL and BURST not in why):
                        break
                    more = longer(runs[0], lengths.get(rate, est["n"]), most)
                    if more is None:
                        break
                    # (an empty window's doublings are not rounds: they find the window, bounded by the cap)
                    rounds += runs[0].get("measured_requests") != 0
                    lengths[rate] = more
                    runs[0] = run_seed(rate, 0)
                if len(runs) == 1:
                    shares[rate] = _share(runs[0])
                # NOTE: the first seed that fails a gate (drops requests, too thin a window)
                # decides the point: no mean over more seeds can rescue it
                if judge_gates(runs[-1], task.min_requests, task.allow_rejections)[0] != PASS:
                    break
                if len(runs) < task.seeds:
                    continue
                if len(runs) >= task.max_seeds:
                    break
                if len(runs) < 2:
                    continue  # (one seed has no interval: too wide)
                p = pool(runs, [scenario.seed + i for i in range(len(runs))], slos)
                if p["widest_ci_rel"] is None or p["widest_ci_rel"] <= task.ci_width:
                    break  # (None: a null metric or a zero mean; judge says what that means)
            pooled[rate] = pool(runs, [scenario.seed + i for i in range(len(runs))], slos)
        return pooled[rate]

    closed = est["closed"]
    # (a closed loop: whole client counts; N clients' window leaves out 2N of the requests (point_scenario),
    # so at most the count that leaves --min-requests measured, and fewer than the requests: batchsim.app.sweep)
    cap = max(1, min(est["n"] - 1, (est["n"] - task.min_requests) // 2)) if closed else None

    def run_search(bound: str):
        return search(evaluate, slos, est["start"], task.tol, min_requests=task.min_requests,
                      allow_rejections=task.allow_rejections, bound=bound, integer=closed,
                      unit="clients" if closed else "req/s", cap=cap)

    found = run_search(BOUNDS[0])
    out.capacity, out.metrics = found.capacity, found.metrics
    capped = closed and found.capacity == cap
    out.limit_rate, out.limit_reason = found.limit_rate, found.limit_reason
    if found.status == NOT_EVALUABLE:
        out.status = "not evaluable"
    elif found.status == REFUSED:
        out.status = "rejects requests"
    elif found.capacity <= 0:
        out.status = "SLO not met"
    if found.capacity > 0:
        out.point_scenario = point_scenario(scenario, found.capacity, est, lengths.get(found.capacity))
        out.requests = float((found.metrics or {}).get("num_requests") or lengths.get(found.capacity, est["n"]))
        out.steady_share = shares.get(found.capacity)
    # NOTE: with one seed there is no interval: the three bounds coincide. A decision that
    # failed at every rate still gets an estimate: "fails at the upper end" may be few seeds.
    if task.max_seeds > 1 and found.status in (PASS, FAIL):
        ends, notes = {}, []
        for bound in BOUNDS[1:]:
            other = run_search(bound)
            ends[bound] = other.capacity if other.status == PASS and other.capacity > 0 else None
            if ends[bound] is None:
                where = {"mean": "the means", "lower": "the intervals' lower ends"}[bound]
                notes.append(f"judged at {where}, no capacity: {other.limit_reason}")
        out.estimate, out.upper = ends["mean"], ends["lower"]
        out.interval_note = "; ".join(notes)
    if capped:  # (the cap is the workload's, not a measured limit)
        out.interval_note = "; ".join(x for x in (out.interval_note, f"capped at {cap} clients, the most whose window "
                                                  f"(the requests less 2 x clients) keeps --min-requests "
                                                  f"{task.min_requests} measured: raise workload.num_requests to find the "
                                                  "limit") if x)
    out.rates = len(pooled)
    out.lengthened, out.longest = len(lengths), max(lengths.values(), default=0)
    out.max_requests = int(most)
    if out.metrics is not None:  # the row's metrics: means and half-widths, not every seed's
        out.metrics = {k: v for k, v in out.metrics.items() if k != "per_seed"}
    return out
