"""``batchsim sweep``: latency, throughput and goodput against offered load per policy.

Thin: loads the scenario, calls :func:`batchsim.app.sweep.sweep` (which stores
points in ``OUT/points`` as they finish and reuses them on a rerun) and
:func:`batchsim.app.sweep.write_sweep`, and prints each policy's saturation point
and every point's summary warnings (an empty or thin measured window, rejected
requests). Ctrl-C exits 130 saying how many finished points are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from batchsim.sim.measure import DEFAULT_SEEDS

from batchsim.app.commands.compare import (ExecutorOpt, PoliciesOpt, SeedsOpt, SetOpt, WorkersOpt, points_line,
                                           writing_kept)

__all__ = ["register", "sweep_command"]


def sweep_command(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file (its workload.arrival.rate, or a closed loop's concurrency, is swept)")],
    rates: Annotated[Optional[str], typer.Option(help="comma-separated offered loads in requests/s, e.g. 2,4,8,12,16")] = None,
    concurrency: Annotated[Optional[str], typer.Option(help="comma-separated closed-loop client counts instead of rates, e.g. 1,4,16,64 (workload.arrival.process: closed)")] = None,
    policies: PoliciesOpt = "static,dynamic,continuous,chunked_prefill",
    seeds: SeedsOpt = DEFAULT_SEEDS,
    out: Annotated[Optional[Path], typer.Option(help="output folder (default runs/sweep-<scenario>)")] = None,
    set_: SetOpt = None,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = None,
) -> None:
    """Sweep the arrival rate (or a closed loop's clients) per policy; write sweep.csv, sweep.png and report.html."""
    from rich.console import Console

    from batchsim.reports.sweep import load_column, saturation_text
    from batchsim.app.commands.compare import load_for_command
    from batchsim.app.sweep import parse_concurrency, parse_rates, point_warnings, sweep, write_sweep
    from batchsim.sim.errors import InputError

    if (rates is None) == (concurrency is None):
        raise InputError("give the loads to sweep: --rates 2,4,8 or --concurrency 1,4,16 (one of them)", "--rates")
    loads = parse_rates(rates) if rates is not None else None
    clients = parse_concurrency(concurrency) if concurrency is not None else None
    sc, base = load_for_command(scenario, set_)
    dest = out or Path("runs") / f"sweep-{sc.name}"
    result = sweep(sc, loads, policies, seeds=seeds, base_dir=base, executor=executor,
                   workers=workers, out_dir=dest, concurrency=clients)
    files = writing_kept(write_sweep, result, dest)
    console = Console(highlight=False)
    for line in saturation_text(result.saturation, load_column(result.frame), result.frame):
        console.print(line)
    for line in point_warnings(result.frame):
        console.print(line, soft_wrap=True, markup=False)
    console.print(f"report: {files['report.html']}")
    console.print(f"table:  {files['sweep.csv']}")
    console.print(points_line(result.simulated, result.reused, result.points_dir), soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``sweep`` to the ``batchsim`` app."""
    app.command("sweep")(sweep_command)
