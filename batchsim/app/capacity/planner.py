"""``batchsim plan``: per configuration, the highest load that meets every SLO, and what it costs.

A configuration is one (hardware, TP, policy, knob values) variant of the
scenario with one replica (:mod:`batchsim.app.capacity.grid`). Its capacity, the highest
arrival rate per replica whose simulation meets every SLO, is searched by
bracketing and bisection (:mod:`batchsim.app.capacity.search`) in one task per
configuration (:mod:`batchsim.app.capacity.worker`); tasks run through
:func:`batchsim.app.workers.run_tasks` on a local process pool, serially, or on Ray.
Then the fleet for a target rate is priced (:mod:`batchsim.app.capacity.costs`), the
configurations not dominated in ($/1M output tokens, latency) are marked as
the Pareto front, and :func:`write_plan` writes ``plan.csv`` (sorted by
cost), ``plan.json`` and ``plan.html``.

Uncertainty: every rate is judged on ``--seeds`` seeds (more while the binding
metric's 95% interval is wider than ``--ci-width``, up to ``--max-seeds``), the
same seeds for every configuration (common random numbers). A point passes
when every SLO holds at its metric's interval's *upper* end, so the capacity
reported (and sized and priced) is the low end of the capacity's interval;
the estimate (SLOs at the means) and the high end (at the lower ends) are
searched too (:mod:`batchsim.app.capacity.worker`).

Resumable: every finished point is stored under ``DIR/points/`` as it
finishes; a rerun of an interrupted plan simulates only the missing points
and writes byte-identical outputs.

NOTE: workers write their points themselves (a killed plan keeps them); the
parent also writes, once a task ends, any point it returned that is not on
disk, so a Ray cluster whose workers cannot reach DIR still stores every
finished configuration.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from batchsim.reports.runs import ReportInfo
from batchsim.app.config import Scenario
from batchsim.sim.errors import InputError
from batchsim.sim.io import write_csv, write_json, write_set
from batchsim.app.capacity.costs import PRICES_FILE, cost_columns, load_prices, price_of
from batchsim.app.capacity.grid import PlanConfig, build_configs
from batchsim.app.capacity.search import MIN_REQUESTS, SLO_METRICS
from batchsim.sim.measure import SHORT_SPANS, TAIL_SPANS, e2e_spans
from batchsim.workloads.config import MAX_REQUESTS
from batchsim.app.capacity.worker import (DEFAULT_CI_WIDTH, DEFAULT_MAX_SEEDS, DEFAULT_SEEDS, ConfigOutcome,
                                          ConfigTask, search_config)

__all__ = ["PlanSpec", "PlanResult", "plan", "plan_rows", "write_plan", "run_searches", "problem_lines",
           "decision_lines",
           "NOT_EVALUABLE", "REJECTS"]

NOT_EVALUABLE, REJECTS = "not evaluable", "rejects requests"  # ConfigOutcome.status values


@dataclass(frozen=True)
class PlanSpec:
    """What to plan: SLOs, the configuration grid, the load to serve and its price."""

    slos: Mapping[str, float]
    hardware: tuple[str, ...] = ()  # empty: the scenario's
    tps: tuple[int, ...] = ()  # empty: the scenario's tensor_parallel_size
    policies: tuple[str, ...] = ()  # empty: the scenario's policy
    knobs: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # (dotted key, values)
    deployments: tuple = ()  # "colocated" and (x, y) xPyD ratios; empty: the scenario's own
    target_rate: float | None = None  # requests/s the whole fleet must serve
    prices: Mapping[str, float] = field(default_factory=dict)  # --price overrides
    price_table: str | None = None  # default batchsim/calibrate/prices.yaml
    tol: float = 0.05  # relative width of the final bracket
    pareto_metric: str = "p99_e2el_ms"
    min_requests: int = MIN_REQUESTS  # completed measured requests a point needs to be evaluable
    allow_rejections: bool = False  # plan configurations that reject requests at any load
    seeds: int = DEFAULT_SEEDS  # seeds each point starts with (seed + 0 .. seeds - 1)
    max_seeds: int | None = None  # the most a point grows to (None: DEFAULT_MAX_SEEDS, or 1 with one seed)
    ci_width: float = DEFAULT_CI_WIDTH  # asked relative half-width of the binding metric's interval
    max_requests: int | None = None  # the most requests a short point is lengthened to (None: LONGER_CAP x the workload's)

    @property
    def seed_cap(self) -> int:
        """The most seeds a point may use."""
        if self.max_seeds is not None:
            return self.max_seeds
        return 1 if self.seeds == 1 else max(self.seeds, DEFAULT_MAX_SEEDS)

    def check(self) -> None:
        """Raise InputError for values no search could use."""
        bad = [k for k in self.slos if k not in SLO_METRICS]
        if not self.slos or bad:
            raise InputError(f"unknown or missing SLO metric(s) {bad}; valid: {', '.join(SLO_METRICS)}", "--slo")
        if self.pareto_metric not in SLO_METRICS:
            raise InputError(f"unknown metric {self.pareto_metric!r}; valid: {', '.join(SLO_METRICS)}",
                             "--pareto-metric")
        if not 0.0 < self.tol < 1.0:
            raise InputError(f"the tolerance must be in (0, 1), got {self.tol:g}", "--tol")
        if self.target_rate is not None and not (self.target_rate > 0 and math.isfinite(self.target_rate)):
            raise InputError(f"must be a positive number of requests/s, got {self.target_rate}", "--target-rate")
        if isinstance(self.min_requests, bool) or not isinstance(self.min_requests, int) or self.min_requests < 1:
            raise InputError(f"must be a whole number >= 1, got {self.min_requests!r}", "--min-requests")
        for name, value in (("--seeds", self.seeds), ("--max-seeds", self.max_seeds)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InputError(f"must be a whole number >= 1, got {value!r}", name)
        if self.seed_cap < self.seeds:
            raise InputError(f"must be at least --seeds ({self.seeds}), got {self.seed_cap}", "--max-seeds")
        if self.max_requests is not None and (isinstance(self.max_requests, bool)
                                              or not isinstance(self.max_requests, int)
                                              or not 1 <= self.max_requests <= MAX_REQUESTS):
            raise InputError(f"must be a whole number from 1 to {MAX_REQUESTS}, got {self.max_requests!r}",
                             "--max-requests")
        if not (0.0 < self.ci_width < 1.0):
            raise InputError(f"must be in (0, 1) (a fraction of the metric's mean), got {self.ci_width:g}",
                             "--ci-width")


@dataclass
class PlanResult:
    """A finished plan: one row per configuration (sorted by cost) and run facts."""

    spec: PlanSpec
    frame: pd.DataFrame
    info: ReportInfo
    simulated: int  # points simulated by this run
    reused: int  # points read back from DIR/points


def run_searches(configs: Sequence[PlanConfig], spec: PlanSpec, points_dir: str | None,
                 base_dir: str | None, executor: str, workers: int | None, ray_address: str | None,
                 show_progress: bool | None,
                 task_fn: Callable[[ConfigTask], ConfigOutcome] = search_config) -> list[ConfigOutcome]:
    """Every configuration's search as one task through run_tasks; outcomes in config order."""
    from contextlib import closing

    from batchsim.app.compare import clean_point_temps
    from batchsim.reports.progress import progress
    from batchsim.app.workers import interrupted, run_tasks

    tasks = [ConfigTask(c, base_dir, tuple(spec.slos.items()), spec.tol, points_dir, spec.min_requests,
                        spec.allow_rejections, spec.seeds, spec.seed_cap, spec.ci_width, spec.max_requests)
             for c in configs]
    outcomes: list[ConfigOutcome | None] = [None] * len(tasks)
    store = Path(points_dir) if points_dir is not None else None
    clean_point_temps(store)  # a killed worker's half-written point files
    before = {p.name for p in store.glob("*.json")} if store is not None and store.is_dir() else set()
    try:
        with progress(len(tasks), "plan", show_progress) as advance, \
                closing(run_tasks(task_fn, tasks, executor, workers, ray_address)) as finished:
            for idx, outcome in finished:
                if store is not None:
                    for key, record in outcome.new_points.items():
                        path = store / f"{key}.json"
                        if not path.exists():  # NOTE: never rewrite a stored point (its mtime shows it was kept)
                            write_json(path, record)
                outcomes[idx] = outcome
                advance(f"{outcome.label}: {outcome.status}")
    except KeyboardInterrupt:
        # workers store each point as it finishes: what is on disk is what a rerun reuses
        # (counted as the points this plan added: the folder may hold other runs' too)
        kept = len({p.name for p in store.glob("*.json")} - before) if store is not None and store.is_dir() else 0
        raise interrupted(kept, points_dir) from None
    return [o for o in outcomes if o is not None]


def _prices(configs: Sequence[PlanConfig], spec: PlanSpec) -> dict[str, float]:
    """USD per GPU-hour per hardware, looked up before any run (a missing price fails early)."""
    from batchsim.calibrate.hardware import load_hardware

    table = {**load_prices(spec.price_table), **spec.prices}
    names = [hw for c in configs for hw in (c.hardware, *(h for h, _ in c.pools))]
    return {hw: price_of(hw, load_hardware(hw).name, table) for hw in dict.fromkeys(names)}


def unit_price(config: PlanConfig, prices: Mapping[str, float]) -> float:
    """USD per GPU-hour of one unit of ``config``: its hardware's, or a disaggregated deployment's
    pools' mean by GPU (so that GPUs x this price is the unit's $/hour)."""
    if not config.pools:
        return prices[config.hardware]
    return sum(prices[hw] * g for hw, g in config.pools) / config.gpus


def _closed_rates(config: PlanConfig, clients: float, metrics: Mapping) -> tuple[float, float | None, float | None]:
    """Requests per second ``clients`` closed-loop clients of ``config`` get (the response-time law
    over the measured requests' mean end-to-end time and the scenario's mean think time), as the
    low end, estimate and high end of its 95% interval: the law carried through the ends of the mean
    E2E's interval over seeds (it falls as the E2E grows). With one seed, or no interval, the ends
    are the estimate and None."""
    from batchsim.reports.stats import CI_SUFFIX
    from batchsim.sim.metrics import closed_loop_throughput

    e2el = metrics.get("mean_e2el_ms")
    if e2el is None:
        return 0.0, None, None
    arrival = (config.scenario.get("workload") or {}).get("arrival") or {}
    think = float(arrival.get("think_time_s") or 0.0)
    mid = closed_loop_throughput(clients, e2el / 1000.0, think)
    half = metrics.get("mean_e2el_ms" + CI_SUFFIX)
    if half is None or half != half:
        return mid, mid, None
    low = closed_loop_throughput(clients, (e2el + half) / 1000.0, think)
    high = closed_loop_throughput(clients, max(e2el - half, 0.0) / 1000.0, think)
    return low, mid, (high if e2el - half > 0 or think > 0 else None)


def _served_output_tokens(o: ConfigOutcome, metrics: Mapping, closed: bool) -> float:
    """Output tokens served per request of the capacity's rate: the workload's mean output,
    less what the capacity point rejected (``--allow-rejections``; the mean over seeds of the
    served share of the output tokens). A closed loop's rate counts only served requests (the
    response-time law over their E2E), so it is the served requests' own mean."""
    if not metrics.get("all_rejected"):
        return o.mean_output_tokens
    tokens, count = metrics.get("all_served_output_share"), metrics.get("all_served_share")
    if tokens is None:  # (no output tokens in the point at all)
        return o.mean_output_tokens
    if closed:
        return o.mean_output_tokens * tokens / count if count else 0.0
    return o.mean_output_tokens * tokens


def plan_rows(configs: Sequence[PlanConfig], outcomes: Sequence[ConfigOutcome], spec: PlanSpec,
              prices: Mapping[str, float], source: tuple[str, Sequence[str]] | None = None) -> pd.DataFrame:
    """plan.csv: one row per configuration, the Pareto front marked, sorted by cost
    (then by capacity, highest first). With ``source`` (the scenario file and the plan's
    ``--set`` overrides), each row with a capacity carries the ``batchsim run`` command
    that reproduces its first seed's point."""
    from batchsim.reports.capacity import pareto_mask
    from batchsim.reports.stats import CI_SUFFIX
    from batchsim.app.capacity.reproduce import run_command

    metrics = list(dict.fromkeys([*spec.slos, spec.pareto_metric]))
    rows = []
    for c, o in zip(configs, outcomes):
        m = o.metrics or {}
        facts = m.get("facts") or {}
        # (a closed loop's search is over clients: its capacity in req/s is the throughput they get in
        # steady state, N / (mean E2E + mean think time), not the run's request_throughput, which a
        # short run's ramp-up and drain pull low)
        closed = c.closed
        # (its interval is the throughput's at those clients, over the seeds; the clients' own
        # interval is in capacity_clients_*)
        rate, estimate, upper = ((_closed_rates(c, o.capacity, m) if o.capacity > 0 else (0.0, None, None))
                                 if closed else (o.capacity, o.estimate, o.upper))
        output_tokens = _served_output_tokens(o, m, closed)
        row = {"config": c.label, "hardware": c.hardware, "tp": c.tp, "policy": c.policy,
               "knobs": " ".join(f"{k}={v}" for k, v in c.knobs), "status": o.status,
               "capacity_rps": rate, "capacity_estimate_rps": estimate, "capacity_high_rps": upper,
               # (the output tokens/s at that rate in steady state, as the $/1M output tokens price it:
               # not the run's output_throughput, whose duration carries the ramp-up and the drain)
               "output_tok_s": rate * output_tokens if rate > 0 else None}
        for k in metrics:
            row[k] = m.get(k)
            row[k + CI_SUFFIX] = m.get(k + CI_SUFFIX) if o.metrics else None
        row.update(seeds=m.get("seeds"), binding_metric=m.get("binding_metric"),
                   binding_ci_rel=m.get("binding_ci_rel"), widest_metric=m.get("widest_metric"),
                   widest_ci_rel=m.get("widest_ci_rel"),
                   interval_ok=(None if m.get("widest_ci_rel") is None else m["widest_ci_rel"] <= spec.ci_width),
                   interval_note=o.interval_note)
        # (how many E2E times the capacity point's measured arrivals span: few, and the run is SHORT)
        row["arrival_span_e2els"] = (e2e_spans(m["arrival_span_s"], m.get("median_e2el_ms"))
                                     if not closed and m.get("arrival_span_s") else None)
        # (the first seed's span over what a steady state needs, SHORT_SPANS median and TAIL_SPANS p99 E2Es,
        # as it decided the point's length: under 1, SHORT)
        row["steady_share"] = o.steady_share if not closed else None
        # (requests per point at the capacity: more than the workload's where a short point was lengthened)
        row.update(point_requests=o.requests or None, lengthened_rates=o.lengthened, longest_point=o.longest or None,
                   max_requests=(o.max_requests or None) if not closed else None)
        row.update(limit_rps=None if closed else o.limit_rate, limit_reason=o.limit_reason, points=o.points, rates=o.rates,
                   rejected=m.get("all_rejected") if o.metrics else None,
                   usd_per_gpu_hour=unit_price(c, prices), target_rps=spec.target_rate)
        # (a unit is one colocated replica of tp GPUs, or one xPyD deployment of its pools' GPUs)
        row.update(cost_columns(rate, c.gpus, unit_price(c, prices), output_tokens, spec.target_rate))
        row.update(policy_knobs=json.dumps(facts["policy"], sort_keys=True) if facts.get("policy") else None,
                   kv_blocks=facts.get("kv_blocks_per_replica"), block_size=facts.get("block_size"),
                   kv_capacity_tokens=facts.get("kv_capacity_tokens_per_replica"),
                   max_model_len=facts.get("max_model_len"), engine=facts.get("engine"),
                   reproduce=(run_command(source[0], source[1], o.point_scenario)
                              if source is not None and o.point_scenario is not None else None),
                   deployment=c.deployment, gpus_per_unit=c.gpus, capacity_rps_per_gpu=rate / c.gpus,
                   capacity_clients=o.capacity if closed else None,
                   capacity_clients_estimate=o.estimate if closed else None,
                   capacity_clients_high=o.upper if closed else None, limit_clients=o.limit_rate if closed else None)
        rows.append(row)
    ok = [i for i, r in enumerate(rows) if r["usd_per_1m_output_tokens"] is not None]
    front = pareto_mask([rows[i]["usd_per_1m_output_tokens"] for i in ok], [rows[i][spec.pareto_metric] for i in ok])
    for r in rows:
        r["pareto"] = False
    for i, on in zip(ok, front):
        rows[i]["pareto"] = bool(on)
    # NOTE: equal cost (same GPU count and price) ranks the higher capacity first: more headroom.
    rows.sort(key=lambda r: (r["usd_per_1m_output_tokens"] is None, r["usd_per_1m_output_tokens"] or 0.0,
                             -r["capacity_rps"], r["config"]))
    return pd.DataFrame(rows)


def problem_lines(frame: pd.DataFrame, width: float = DEFAULT_CI_WIDTH) -> list[str]:
    """One line per configuration that has no capacity because a point could not be judged
    (``NOT EVALUABLE ...``) or because it rejects requests at any load (``REJECTS ...``),
    one per configuration whose capacity counts rejected requests (``--allow-rejections``),
    one per capacity whose SLO metrics' intervals stayed wider than ``width`` (``WIDE ...``),
    one per configuration that fails only at the intervals' upper ends (``UNDECIDED ...``),
    one per capacity interval with a missing end (``note: ...``) and one per capacity whose
    measured arrivals span fewer than :data:`~batchsim.sim.measure.SHORT_SPANS` E2E times (``SHORT ...``)."""
    lines = []
    for r in frame.to_dict(orient="records"):
        if r["status"] == NOT_EVALUABLE:
            lines.append(f"NOT EVALUABLE {r['config']}: {r['limit_reason']}")
        elif r["status"] == REJECTS:
            lines.append(f"REJECTS {r['config']}: {r['limit_reason']}")
        elif r["status"] == "ok" and r.get("rejected"):
            many = (r.get("seeds") or 1) > 1
            count = f"{r['rejected']:.3g} requests (mean over {int(r['seeds'])} seeds)" if many \
                else f"{int(r['rejected'])} requests"
            # (a closed loop's throughput is the law over the served requests' E2E: a rejected request's
            # cycle, its time to rejection and its think time, is not in it)
            closed = r.get("capacity_clients") is not None and r["capacity_clients"] == r["capacity_clients"]
            lines.append(f"warning: {r['config']}: its capacity rejects {count} "
                         "(allowed by --allow-rejections); they count as failing, not as served, and its "
                         "output tok/s and $/1M count only the served requests' tokens"
                         + ("; its throughput counts only the served requests' cycles "
                            "(N / (their mean E2E + think time))" if closed else ""))
        if r["status"] == "ok" and r.get("interval_ok") is False:
            lines.append(f"WIDE {r['config']}: at its capacity {r['widest_metric']} is known to "
                         f"±{r['widest_ci_rel']:.0%} after {int(r['seeds'])} seeds (asked ±{width:.0%}); "
                         "raise --max-seeds or workload.num_requests")
        clients = r.get("capacity_clients_estimate")  # (a closed loop's search is over clients)
        undecided = (f"{clients:g} clients" if clients is not None and clients == clients and clients > 0 else
                     f"{r['capacity_estimate_rps']:.4g} req/s" if r.get("capacity_estimate_rps") else None)
        if r["status"] == "SLO not met" and undecided:
            load = "client count" if clients is not None and clients == clients and clients > 0 else "rate"
            lines.append(f"UNDECIDED {r['config']}: no {load} meets the SLO at its intervals' upper ends, but "
                         f"the means meet it up to {undecided}; more seeds "
                         "(--max-seeds) or requests per point would decide")
        elif r["status"] == "ok" and r.get("interval_note"):
            lines.append(f"note: {r['config']}: the capacity interval is open: {r['interval_note']}")
        share, spans = r.get("steady_share"), r.get("arrival_span_e2els")
        if r["status"] == "ok" and share is not None and share == share and share < 1.0:
            requests, most = r.get("point_requests"), r.get("max_requests")
            ran = (f" with {requests:.0f} requests (the most --max-requests allows)"
                   if requests == requests and most == most and requests and most and requests >= most else "")
            lines.append(f"SHORT {r['config']}: at its capacity the measured requests arrive within "
                         f"{share:.0%} of the span a steady state needs ({SHORT_SPANS:g} median and "
                         f"{TAIL_SPANS:g} p99 E2E times; it spans {spans:.1f} median E2Es){ran}: too short for a "
                         "queue that grows, or the running batch of the longest requests, to break the SLOs, so the "
                         "capacity may be overstated; raise --max-requests, or run longer (workload.num_requests, or "
                         "duration_s or the trace's window, whose points are not lengthened)")
    return lines


def decision_lines(result: "PlanResult") -> list[str]:
    """How the plan decided, and the command that reproduces its first row's first seed."""
    spec, frame = result.spec, result.frame
    lines = [f"seeds: {_seed_text_short(spec)}"]
    longer = frame[frame["lengthened_rates"] > 0] if "lengthened_rates" in frame else frame.iloc[0:0]
    if len(longer):
        rates = int(longer["lengthened_rates"].sum())
        most = int(longer["longest_point"].max())
        lines.append(f"longer points: {rates} rate(s) of {len(longer)} configuration(s) ran with more requests "
                     f"than the workload's (up to {most}), so that their measured arrivals span what a steady "
                     f"state needs, {SHORT_SPANS:g} median and {TAIL_SPANS:g} p99 E2E times (--max-requests; "
                     "plan.csv: point_requests)")
    if len(frame) and frame.iloc[0]["status"] == "ok":
        top = frame.iloc[0]
        lines.append(f"cheapest: {top['config']}")
        command = top.get("reproduce")
        if isinstance(command, str) and command:  # (a row without one holds NaN, which is truthy)
            lines.append(f"reproduce its first seed: {command}")
    return lines


def _seed_text_short(spec: PlanSpec) -> str:
    if spec.seed_cap == 1:
        return "one per point: capacities have no interval (use --seeds 3 or more)"
    return (f"{spec.seeds} per point (up to {spec.seed_cap} until the binding metric is known to "
            f"±{spec.ci_width:.0%}); capacity = the low end of its 95% interval (SLOs judged at each "
            "metric's upper 95% bound)")


def _info(scenario: Scenario, spec: PlanSpec, configs: Sequence[PlanConfig], prices: Mapping[str, float],
          simulated: int, reused: int) -> ReportInfo:
    """The report header: what was planned, under which SLOs and prices."""
    from batchsim.calibrate.hardware import load_hardware
    from batchsim import __version__
    from batchsim.app.compare import describe_workload

    hws = list(dict.fromkeys(c.hardware for c in configs))
    slo = ", ".join(f"{k} ≤ {v:g}" for k, v in spec.slos.items())
    target = f"{spec.target_rate:g} req/s" if spec.target_rate else "none (one replica at its capacity is priced)"
    details = (
        ("SLO", slo),
        ("target load", target),
        ("configurations", f"{len(configs)}: hardware {', '.join(hws)}; TP "
                           f"{', '.join(str(t) for t in dict.fromkeys(c.tp for c in configs))}; policies "
                           f"{', '.join(dict.fromkeys(c.policy for c in configs))}"),
        ("workload", describe_workload(scenario)),
        ("search", f"bracket by doubling, bisect to {spec.tol:.0%}; {simulated + reused} points "
                   f"(simulations: a seed at a rate); a point needs {spec.min_requests} completed "
                   "measured requests (in every seed) to be evaluable"),
        ("seeds", _seed_text(scenario, spec)),
        ("rejections", "allowed (--allow-rejections): rejected requests count as failing" if spec.allow_rejections
         else "a configuration that rejects requests at any load is refused"),
        ("prices (USD/GPU-hour)", ", ".join(f"{h} {p:g}" for h, p in prices.items())
         + f" (from {Path(spec.price_table or PRICES_FILE).name} and --price)"),
    )
    return ReportInfo(title=f"batchsim plan: {scenario.name}", scenario=scenario.name, model=scenario.model,
                      hardware=", ".join(hws), version=__version__, details=details,
                      calibrated=all(bool(getattr(load_hardware(h), "calibrated", False)) for h in hws))


def _seed_text(scenario: Scenario, spec: PlanSpec) -> str:
    if spec.seed_cap == 1:
        return (f"one seed ({scenario.seed}): capacities have no interval; the SLOs are judged at the point's "
                "values (use --seeds 3 or more for intervals)")
    return (f"seeds {scenario.seed}+0..{spec.seeds - 1} per point, more (to {spec.seed_cap}) while the binding "
            f"SLO metric's 95% interval is wider than ±{spec.ci_width:.0%} of its mean; the same seeds for "
            "every configuration and rate (common random numbers). A point passes when every SLO holds at "
            "its 95% interval's upper end: the capacity shown (and sized and priced) is the low end of "
            "its interval; the estimate judges the means, the high end the lower ends")


def plan(scenario: Scenario, spec: PlanSpec, out_dir: str | Path | None = None,
         base_dir: str | Path | None = None, executor: str = "local", workers: int | None = None,
         ray_address: str | None = None, show_progress: bool | None = None,
         task_fn: Callable[[ConfigTask], ConfigOutcome] = search_config,
         source: tuple[str, Sequence[str]] | None = None) -> PlanResult:
    """Search every configuration's capacity and price the fleet; points go to ``out_dir/points``.

    ``source`` (the scenario file and the ``--set`` overrides that made ``scenario``) adds
    each row's reproducing ``batchsim run`` command."""
    spec.check()
    asked = scenario.workload.num_requests
    if spec.max_requests is not None and asked is not None and spec.max_requests < asked:
        raise InputError(f"must be at least workload.num_requests ({asked}), got {spec.max_requests} (equal to it: "
                         "points are never lengthened)", "--max-requests")
    configs = build_configs(scenario, spec.hardware, spec.tps, spec.policies, spec.knobs, spec.deployments)
    prices = _prices(configs, spec)
    points_dir = str((Path(out_dir) / "points").resolve()) if out_dir is not None else None
    base = str(Path(base_dir).resolve()) if base_dir is not None else None
    outcomes = run_searches(configs, spec, points_dir, base, executor, workers, ray_address,
                            show_progress, task_fn)
    simulated = sum(len(o.new_points) for o in outcomes)
    reused = sum(o.reused for o in outcomes)
    frame = plan_rows(configs, outcomes, spec, prices, source)
    return PlanResult(spec, frame, _info(scenario, spec, configs, prices, simulated, reused),
                      simulated, reused)


def write_plan(result: PlanResult, out_dir: str | Path) -> dict[str, Path]:
    """Write plan.csv, plan.json (the spec and the rows) and plan.html as one set
    (:func:`batchsim.sim.io.write_set`: never a mix with an earlier plan's files;
    ``points/`` is kept)."""
    from batchsim.reports.capacity import plan_page

    out = Path(out_dir)
    spec = result.spec
    records = result.frame.astype(object).where(result.frame.notna(), None).to_dict(orient="records")
    doc = {"slos": dict(spec.slos), "target_rate": spec.target_rate, "tol": spec.tol,
           "pareto_metric": spec.pareto_metric, "min_requests": spec.min_requests,
           "allow_rejections": spec.allow_rejections, "seeds": spec.seeds, "max_seeds": spec.seed_cap,
           "ci_width": spec.ci_width, "max_requests": spec.max_requests, "decided_at": "upper end of each SLO metric's 95% interval" if
           spec.seed_cap > 1 else "the point's values (one seed)", "configurations": records}
    html = plan_page(result.frame, result.info, list(spec.slos), spec.pareto_metric, spec.target_rate,
                     spec.allow_rejections, problem_lines(result.frame, spec.ci_width), spec.seed_cap > 1)
    write_set(out, {"plan.csv": lambda p: write_csv(p, result.frame),
                    "plan.json": lambda p: write_json(p, doc),
                    "plan.html": lambda p: p.write_text(html, encoding="utf-8")},
              {"kind": "plan", "scenario": result.info.scenario})
    return {"plan.csv": out / "plan.csv", "plan.json": out / "plan.json", "plan.html": out / "plan.html"}
