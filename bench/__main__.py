"""``python -m bench``: a thin typer command over :func:`bench.suite.benchmark`.

Bad options print one error line and exit 2; a flagged slowdown exits 1
only with ``--fail-on-slowdown`` (the machine is shared, so by default the
flag is a prompt to rerun, not a failure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from bench.compare import THRESHOLD
from bench.runner import Limits
from bench.scenarios import LOADS, POLICIES, QUICK_SIZES, REPLICAS, SIZES, make_cases, parse_sizes
from bench.suite import benchmark

app = typer.Typer(add_completion=False, help="Time the simulator on fixed ShareGPT-like scenarios.")

RESULTS = Path(__file__).resolve().parent / "results"
QUICK_TIMEOUT_S = 15.0


def _items(text: str | None, default: tuple) -> tuple:
    return default if text is None else tuple(s.strip() for s in text.split(",") if s.strip())


@app.command()
def main(
    quick: Annotated[bool, typer.Option("--quick", help=f"10k requests only, {QUICK_TIMEOUT_S:g} s per case unless --timeout")] = False,
    sizes: Annotated[Optional[str], typer.Option(help="request counts, e.g. 10k,100k,1M")] = None,
    policies: Annotated[Optional[str], typer.Option(help=f"comma list of {', '.join(POLICIES)}")] = None,
    loads: Annotated[Optional[str], typer.Option(help=f"comma list of {', '.join(LOADS)}")] = None,
    replicas: Annotated[Optional[str], typer.Option(help="replica counts, e.g. 1,4")] = None,
    out: Annotated[Path, typer.Option(help="folder of result files")] = RESULTS,
    label: Annotated[Optional[str], typer.Option(help="result file name (default: UTC timestamp)")] = None,
    compare: Annotated[Optional[Path], typer.Option("--compare", help="result file to compare with (default: newest in --out)")] = None,
    timeout: Annotated[Optional[float], typer.Option(help="seconds per case before it is recorded as a timeout (default 300)")] = None,
    mem_limit_mb: Annotated[float, typer.Option(help="kill a case whose RSS passes this (MiB)")] = Limits.mem_limit_mb,
    threshold: Annotated[float, typer.Option(help="flag a calibrated slowdown beyond this fraction")] = THRESHOLD,
    fail_on_slowdown: Annotated[bool, typer.Option("--fail-on-slowdown", help="exit 1 when a case is flagged")] = False,
) -> None:
    """Run the benchmark cases one by one, write the results, compare with the previous run."""
    try:
        size_list = parse_sizes(sizes) if sizes else (QUICK_SIZES if quick else SIZES)
        replica_list = tuple(int(r) for r in _items(replicas, tuple(map(str, REPLICAS))))
        cases = make_cases(size_list, _items(policies, POLICIES), _items(loads, tuple(LOADS)), replica_list)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if compare is not None and not compare.is_file():
        raise typer.BadParameter(f"no such result file: {compare}", param_hint="--compare")
    budget = timeout if timeout is not None else (QUICK_TIMEOUT_S if quick else Limits.timeout_s)
    report = benchmark(cases, out, Limits(timeout_s=budget, mem_limit_mb=mem_limit_mb), label, compare,
                       threshold, echo=typer.echo)
    typer.echo("\n" + report.markdown)
    typer.echo(f"wrote {report.json_path} and {report.markdown_path}")
    if report.slowdowns:
        typer.echo(f"{len(report.slowdowns)} case(s) flagged: "
                   + ", ".join(f"{r['key']} {r['flag']}" for r in report.slowdowns))
        if fail_on_slowdown:
            raise typer.Exit(1)


if __name__ == "__main__":
    app()
