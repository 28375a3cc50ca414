"""``batchsim plan``: capacity under SLOs per (hardware, TP, policy, knobs), replicas and cost.

Thin: parses the options into a :class:`batchsim.app.capacity.planner.PlanSpec`, calls
:func:`batchsim.app.capacity.planner.plan` and :func:`batchsim.app.capacity.planner.write_plan`, prints the table
sorted by cost and how many points were simulated or reused (a rerun into
the same ``--out`` resumes), then one line per configuration without a
capacity because a point was not evaluable (``NOT EVALUABLE``) or because it
rejects requests (``REJECTS``). Bad input is an InputError (exit 2); a plan in
which no configuration is evaluable exits 1 (it answers nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from batchsim.app.commands.compare import ExecutorOpt, SetOpt, WorkersOpt
from batchsim.sim.measure import DEFAULT_CI_WIDTH, DEFAULT_MAX_SEEDS, DEFAULT_SEEDS, MIN_REQUESTS

__all__ = ["register", "plan_command"]

ListOpt = Optional[list[str]]


def plan_command(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file (its workload.arrival.rate is searched; a closed loop's clients)")],
    slo: Annotated[ListOpt, typer.Option("--slo", help="NAME=LIMIT_MS a configuration must meet, e.g. p99_ttft_ms=500 "
                                                       "(repeatable; names are summary.json keys, plus *_queue_ms)")] = None,
    target_rate: Annotated[Optional[float], typer.Option(help="requests/s the fleet must serve (sizes replicas and cost)")] = None,
    hardware: Annotated[Optional[str], typer.Option(help="comma-separated hardware profiles (default: the scenario's)")] = None,
    tp: Annotated[Optional[str], typer.Option(help="comma-separated tensor-parallel sizes, e.g. 1,2,4")] = None,
    policies: Annotated[Optional[str], typer.Option(help="comma-separated policies (default: the scenario's)")] = None,
    disagg: Annotated[Optional[str], typer.Option(help="comma-separated deployments: colocated and xPyD, e.g. "
                                                      "colocated,1P1D,1P2D,2P1D (x prefill and y decode replicas; the pools "
                                                      "as the scenario's disaggregation section or its top level)")] = None,
    knob: Annotated[ListOpt, typer.Option("--knob", help="dotted.key=v1,v2,...: try each value, e.g. "
                                                         "policy.max_num_batched_tokens=256,512 (repeatable)")] = None,
    price: Annotated[ListOpt, typer.Option("--price", help="HW=USD_PER_GPU_HOUR overriding the price table (repeatable)")] = None,
    prices: Annotated[Optional[Path], typer.Option(help="price table YAML (default batchsim/calibrate/prices.yaml)")] = None,
    tol: Annotated[float, typer.Option(help="stop bisecting when the bracket is within this fraction of its low end")] = 0.05,
    pareto_metric: Annotated[str, typer.Option(help="latency axis of the Pareto front")] = "p99_e2el_ms",
    min_requests: Annotated[int, typer.Option(min=1, help="completed requests a point needs in its measured window to be "
                                                          "evaluable (fewer: a p99 is about the maximum)")] = MIN_REQUESTS,
    allow_rejections: Annotated[bool, typer.Option("--allow-rejections", help="plan configurations that reject requests "
                                                   "at any load (too long for max_model_len, the KV cache or the step "
                                                   "budget); rejected requests then count as failing")] = False,
    seeds: Annotated[int, typer.Option(min=1, help="seeds each point starts with (scenario seed + i, the same for every "
                                                   "configuration); 1: no intervals")] = DEFAULT_SEEDS,
    max_seeds: Annotated[Optional[int], typer.Option(min=1, help="the most seeds a point grows to while an SLO "
                                                               f"metric's interval is too wide (default {DEFAULT_MAX_SEEDS}; "
                                                               "1 with --seeds 1)")] = None,
    ci_width: Annotated[float, typer.Option(help="asked half-width of each SLO metric's 95% interval, as a "
                                                 "fraction of its mean")] = DEFAULT_CI_WIDTH,
    max_requests: Annotated[Optional[int], typer.Option(min=1, help="the most requests a point runs: a point whose "
                                                                  "measured arrivals span fewer than 10 median or 5 p99 "
                                                                  "E2E times (too short for a steady state) runs again "
                                                                  "with more, up to this (default 10x "
                                                                  "workload.num_requests; workload.num_requests: "
                                                                  "never)")] = None,
    out: Annotated[Optional[Path], typer.Option(help="output folder; rerunning into it resumes (default runs/plan-<scenario>)")] = None,
    set_: SetOpt = None,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = None,
    ray_address: Annotated[Optional[str], typer.Option(help="Ray cluster address for --executor ray (default: start a local Ray)")] = None,
) -> None:
    """Find each configuration's highest load under the SLOs; write plan.csv, plan.json and plan.html."""
    from rich.console import Console

    from batchsim.reports.capacity import console_table
    from batchsim.app.commands.compare import load_for_command
    from batchsim.app.capacity.planner import NOT_EVALUABLE, PlanSpec, decision_lines, plan, problem_lines, write_plan
    from batchsim.app.capacity.costs import parse_prices
    from batchsim.app.capacity.grid import parse_deployments, parse_knobs, parse_names, parse_tps
    from batchsim.app.capacity.search import parse_slos

    spec = PlanSpec(slos=parse_slos(slo), hardware=parse_names(hardware, "--hardware"), tps=parse_tps(tp),
                    policies=parse_names(policies, "--policies"), knobs=parse_knobs(knob),
                    deployments=parse_deployments(disagg),
                    target_rate=target_rate, prices=parse_prices(price),
                    price_table=str(prices) if prices is not None else None, tol=tol, pareto_metric=pareto_metric,
                    min_requests=min_requests, allow_rejections=allow_rejections, seeds=seeds,
                    max_seeds=max_seeds, ci_width=ci_width, max_requests=max_requests)
    sc, base = load_for_command(scenario, set_)
    dest = out or Path("runs") / f"plan-{sc.name}"
    result = plan(sc, spec, dest, base_dir=base, executor=executor, workers=workers, ray_address=ray_address,
                  source=(str(scenario), tuple(set_ or ())))
    files = write_plan(result, dest)
    # NOTE: piped output is not a terminal; rich would wrap the table at 80 columns.
    console = Console(width=None if Console().is_terminal else 240, highlight=False)
    unit = "replica" if all(c == "colocated" for c in result.frame.get("deployment", [])) else "replica or deployment"
    title = f"{sc.name}: {result.info.model}, capacity per {unit} under {', '.join(spec.slos)}"
    console.print(console_table(result.frame, list(spec.slos), spec.pareto_metric, spec.target_rate, title,
                                spec.allow_rejections, spec.seed_cap > 1))
    for line in problem_lines(result.frame, spec.ci_width):
        console.print(line, soft_wrap=True, markup=False)
    for line in decision_lines(result):
        console.print(line, soft_wrap=True, markup=False)
    console.print(f"points: {result.simulated} simulated, {result.reused} reused from {dest / 'points'}")
    console.print(f"report: {files['plan.html']}")
    console.print(f"table:  {files['plan.csv']}")
    status = result.frame["status"]
    if len(status) and (status == NOT_EVALUABLE).any() and not (status.isin(("ok", "SLO not met"))).any():
        console.print(f"no configuration is evaluable: no capacity is reported (a point needs at least "
                      f"{spec.min_requests} completed requests in its measured window; see the lines above)",
                      soft_wrap=True, markup=False)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``plan`` to the ``batchsim`` app."""
    app.command("plan")(plan_command)
