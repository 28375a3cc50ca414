"""``batchsim regress``: the CI gate for scheduler changes.

Thin: parses options, calls :func:`batchsim.app.regress.regress`, prints the diff
table and one greppable line per failing metric, writes the JUnit and
markdown files, and exits 0 (no regression), 1 (regression) or 2 (bad input,
raised as :class:`batchsim.sim.errors.InputError` and mapped by ``batchsim.app.cli.main``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from batchsim.sim.measure import MIN_REQUESTS

DEFAULT_SEEDS = 10  # NOTE: batchsim.app.regress.DEFAULT_SEEDS (not imported here: the CLI loads lazily)

__all__ = ["register", "regress_command"]


def regress_command(
    scenarios: Annotated[list[Path], typer.Argument(help="pinned scenario YAML files")],
    baseline: Annotated[Path, typer.Option(help="baseline JSON file (created by --update)")],
    update: Annotated[bool, typer.Option("--update", help="accept the current results: rewrite the baseline entries of these scenarios and exit 0")] = False,
    rtol: Annotated[float, typer.Option(help="relative tolerance: a metric fails when it moves the worse way by more than rtol x |baseline| (and its absolute floor), beyond the noise (a finite number >= 0)")] = 0.02,
    metrics: Annotated[Optional[list[str]], typer.Option("--metrics", help="summary keys to check (repeatable or comma-separated); default: p50/p99 TTFT, TPOT, ITL, E2E, throughputs, goodput, completed, rejected")] = None,
    junit: Annotated[Optional[Path], typer.Option(help="write JUnit XML here (one test case per scenario x metric)")] = None,
    markdown: Annotated[Optional[Path], typer.Option(help="write a markdown summary here (for a pull-request comment)")] = None,
    all_rows: Annotated[bool, typer.Option("--all/--changes", help="show every metric in the table, or only those that moved")] = True,
    min_requests: Annotated[int, typer.Option(min=1, help="completed requests a scenario needs in its measured window; fewer is 'not evaluable', a failure")] = MIN_REQUESTS,
    seeds: Annotated[int, typer.Option(min=1, help="seeds per scenario (seed, seed+1, ...): the gate pairs them with the baseline's seeds and tests the differences (Holm over every check of the run)")] = DEFAULT_SEEDS,
) -> None:
    """Re-simulate pinned scenarios and diff their metrics against a baseline; exit 1 on regression."""
    from rich.console import Console
    from rich.markup import escape as esc

    from batchsim.reports.regression import FAILING, diff_table, provenance_text, to_junit, to_markdown
    from batchsim.sim.io import require_file, write_files
    from batchsim.app.regress import regress
    from batchsim.sim.errors import InputError

    # every output is checked before the work, and written after it as one set
    outputs = {"--baseline": baseline, "--junit": junit, "--markdown": markdown}
    require_file(junit, "--junit", "the JUnit XML")
    require_file(markdown, "--markdown", "the markdown summary")
    if baseline.is_dir():
        raise InputError("is a folder; expected a baseline JSON file", f"--baseline {baseline}")
    if update:
        require_file(baseline, "--baseline", "the baseline")
    seen: dict[Path, str] = {}
    for option, path in outputs.items():
        if path is not None:
            other = seen.setdefault(path.absolute(), option)
            if other != option:
                raise InputError(f"{path} is also given as {other}; expected a file of its own", option)
    report = regress(scenarios, baseline, update=update, rtol=rtol, metrics=metrics, min_requests=min_requests,
                     seeds=seeds, write=False)
    files: dict[Path, bytes] = {}
    if report.baseline_text is not None:
        files[baseline] = report.baseline_text.encode("utf-8")
    if junit is not None:
        files[junit] = to_junit(report).encode("utf-8")
    if markdown is not None:
        files[markdown] = to_markdown(report).encode("utf-8")
    write_files(files)
    # NOTE: CI logs are not terminals; rich would wrap the table at 80 columns.
    console = Console(width=None if Console().is_terminal else 160, highlight=False)
    if all_rows or any(d.status != "ok" for s in report.scenarios for d in s.diffs):
        console.print(diff_table(report, only_changes=not all_rows))
    else:
        console.print(f"every metric of {len(report.scenarios)} scenario(s) within tolerance of {baseline}")
    for s in report.scenarios:
        for p in s.problems:
            console.print(f"[bold red]SCENARIO[/] {esc(s.key)}: {esc(p)}", soft_wrap=True)
        for n in s.notes:
            console.print(f"note: {esc(s.key)}: {esc(n)}", soft_wrap=True)
    for s, d in report.rows(*FAILING):
        # NOTE: after --update these are accepted, not failed; say so in the prefix.
        label = f"ACCEPTED-{d.status.upper()}" if report.updated else d.status.upper()
        console.print(f"[bold red]{label}[/] {esc(s.key)}: {esc(d.describe())}", soft_wrap=True)
    for s, d in report.rows("improved"):
        console.print(f"[cyan]IMPROVED[/] {esc(s.key)}: {esc(d.describe())}", soft_wrap=True)
    for n in report.notes:
        console.print(f"note: {esc(n)}", soft_wrap=True)
    for s in report.scenarios:
        console.print(f"provenance: {esc(s.key)} ({s.sameness}): {esc(provenance_text(s))}", soft_wrap=True)
    console.print(f"reproduce: {esc(report.command)}", soft_wrap=True)
    n_bad = len(report.rows(*FAILING))
    n_broken = sum(bool(s.problems) for s in report.scenarios)
    if report.updated:
        console.print(f"baseline {baseline} updated ({len(report.scenarios)} scenario(s))")
    elif report.failed:
        console.print(f"[bold red]FAILED[/]: {n_bad} failing metric(s), {n_broken} scenario problem(s)")
    else:
        console.print(f"[green]OK[/]: no regressions in {len(report.scenarios)} scenario(s), "
                      f"{len(report.rows('improved'))} improvement(s)")
    raise typer.Exit(report.exit_code)


def register(app: typer.Typer) -> None:
    """Add ``regress`` to the ``batchsim`` app."""
    app.command("regress")(regress_command)
