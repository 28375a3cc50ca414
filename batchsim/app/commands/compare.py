"""``batchsim compare``: every chosen policy on the same workload, as an HTML report.

Thin: loads the scenario (the built-in example when none is given), calls
:func:`batchsim.app.compare.compare` (which stores finished runs in ``OUT/points`` and
reuses them on a rerun) and :func:`batchsim.app.compare.write_comparison`, prints
the summary table. Bad input is an :class:`batchsim.sim.errors.InputError` (exit 2);
Ctrl-C exits 130 saying how many finished runs are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from batchsim.sim.measure import DEFAULT_SEEDS

__all__ = ["register", "compare_command", "load_for_command", "points_line", "writing_kept"]

SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="override a scenario field: dotted.key=value (repeatable)")]
PoliciesOpt = Annotated[str, typer.Option(help="comma-separated policies to run on the same workload")]
SeedsOpt = Annotated[int, typer.Option(min=1, help="independent seeds per policy (scenario seed + i, the same for every policy); "
                                                   "metrics are mean ± 95% CI; 1: one run, no interval")]
ExecutorOpt = Annotated[str, typer.Option(help="where runs execute: local (process pool), serial (this process) or ray")]
WorkersOpt = Annotated[Optional[int], typer.Option(min=1, help="parallel runs (default: one per core)")]


def load_for_command(scenario: Path | None, overrides: list[str] | None):
    """The scenario (or the built-in example) and the folder its paths resolve against."""
    from batchsim.app.builtin import builtin_scenario_path
    from batchsim.app.config import load_scenario

    path = scenario if scenario is not None else builtin_scenario_path()
    return load_scenario(path, list(overrides or [])), Path(path).resolve().parent


def points_line(simulated: int, reused: int, folder: Path | None) -> str:
    """``points: N simulated, M reused from OUT/points``."""
    return f"points: {simulated} simulated, {reused} reused from {folder}"


def writing_kept(write, result, dest: Path):
    """``write(result, dest)``; a Ctrl-C while writing the outputs (the set is written whole
    or not at all) says the finished points are kept."""
    from batchsim.app.workers import interrupted

    try:
        return write(result, dest)
    except KeyboardInterrupt:
        raise interrupted(result.simulated + result.reused, result.points_dir) from None


def compare_command(
    scenario: Annotated[Optional[Path], typer.Argument(help="scenario YAML file (default: the built-in example)")] = None,
    policies: PoliciesOpt = "static,dynamic,continuous,chunked_prefill",
    seeds: SeedsOpt = DEFAULT_SEEDS,
    out: Annotated[Optional[Path], typer.Option(help="output folder (default runs/compare-<scenario>)")] = None,
    set_: SetOpt = None,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = None,
) -> None:
    """Run every chosen policy on the identical workload; write summary.csv, PNGs and report.html."""
    from rich.console import Console

    from batchsim.app.compare import compare, write_comparison
    from batchsim.app.summary_table import summary_table

    sc, base = load_for_command(scenario, set_)
    dest = out or Path("runs") / f"compare-{sc.name}"
    comp = compare(sc, policies, seeds=seeds, base_dir=base, executor=executor, workers=workers, out_dir=dest)
    files = writing_kept(write_comparison, comp, dest)
    info = comp.info
    title = f"{sc.name}: {info.model} on {info.hardware}" + (f", mean of {seeds} seeds" if seeds > 1 else "")
    # NOTE: piped output is not a terminal; rich would wrap the table at 80 columns.
    console = Console(width=None if Console().is_terminal else 140)
    console.print(summary_table(comp.summaries, title=title))
    console.print(f"report: {files['report.html']}")
    console.print(f"table:  {files['summary.csv']}")
    console.print(points_line(comp.simulated, comp.reused, comp.points_dir), highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``compare`` to the ``batchsim`` app."""
    app.command("compare")(compare_command)
