"""The ``batchsim`` command line: thin typer commands over library calls.

Each command parses its options and calls one library function. Bad input
(:class:`batchsim.sim.errors.InputError`, a missing file, a bad option) prints one
``error:`` line and exits 2 with no traceback unless ``--debug`` is given.
"""

from __future__ import annotations

import math
import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from batchsim import __version__
from batchsim.sim.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Simulate LLM inference batching policies, priced by a roofline cost model.")
_state = {"debug": False}
err_console = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"batchsim {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks for errors")] = False,
    version: Annotated[bool, typer.Option("--version", help="print the version and exit", is_eager=True,
                                          callback=_print_version)] = False,
) -> None:
    # NOTE: --version is eager: a group without a command fails ("Missing
    # command") before its own callback runs.
    _state["debug"] = debug


SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="override a scenario field: dotted.key=value (repeatable)")]


def _load(scenario: Path | None, policy: str | None, overrides: list[str] | None):
    from batchsim.app.builtin import builtin_scenario_path
    from batchsim.app.config import load_scenario

    path = scenario if scenario is not None else builtin_scenario_path()
    if not policy:  # (without a swap, no need of the compare module and its pandas: a run starts fast)
        return load_scenario(path, list(overrides or [])), Path(path).resolve().parent
    from batchsim.app.compare import load_with_policy

    # (with --policy, the swap compare, sweep and plan make; --set policy.* then sets the policy that runs)
    return load_with_policy(path, policy, overrides or []), Path(path).resolve().parent


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    policy: Annotated[Optional[str], typer.Option(help="run this policy instead of the scenario's, with the scenario's policy_knobs for it (as compare and plan do); --set policy.K=V then sets its knobs")] = None,
    set_: SetOpt = None,
    out: Annotated[Optional[Path], typer.Option(help="output folder (default runs/<scenario>-<policy>)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary JSON on stdout instead of a table")] = False,
    fmt: Annotated[str, typer.Option("--format", help="records format: csv, parquet, or auto (CSV up to 100,000 requests, Parquet above)")] = "auto",
    steps: Annotated[str, typer.Option("--steps", help="step records: rows (one per step), timeline (one per replica per --timeline-s), none, or auto (rows up to 250,000 steps, a timeline above)")] = "auto",
    timeline_s: Annotated[Optional[float], typer.Option("--timeline-s", help="seconds per timeline row (--steps timeline; default: the shortest of 1, 2, 5, 10, ... s that covers the arrivals in 10,000 rows)")] = None,
) -> None:
    """Run one simulation: print a summary, write summary.json, requests and steps (CSV or Parquet)."""
    from batchsim import policies
    from batchsim.app.config import naming_file
    from batchsim.app.runner import STEP_MODES, run_to_folder
    from batchsim.app.summary_table import deployment_label, summary_table
    from batchsim.sim.io import FORMATS, require_folder

    if fmt not in ("auto", *FORMATS):
        raise InputError(f"got {fmt!r}; expected auto, {', '.join(FORMATS)}", "--format")
    if steps not in ("auto", *STEP_MODES):
        raise InputError(f"got {steps!r}; expected auto, {', '.join(STEP_MODES)}", "--steps")
    if timeline_s is not None and not (1e-3 <= timeline_s and math.isfinite(timeline_s)):
        raise InputError(f"got {timeline_s!r}; expected a number of seconds, at least 0.001", "--timeline-s")
    sc, base = _load(scenario, policy, set_)
    require_folder(out, "--out", "the records")  # (say so before the run, not after)
    # the command that reproduces this summary (the scenario file, the policy swap, the overrides)
    command = shlex.join(["batchsim", "run", str(scenario), *(["--policy", policy] if policy else []),
                          *[a for s in (set_ or []) for a in ("--set", s)]])
    name = naming_file(scenario, policies.create_policy, sc.policy).name
    dest = out or Path("runs") / f"{sc.name}-{name}"
    result, written = naming_file(scenario, run_to_folder, sc, dest, base, fmt, command, steps, timeline_s)
    if as_json:
        typer.echo(json.dumps(result.summary, indent=2))
    else:
        console = Console()
        console.print(summary_table([result.summary], title=f"{sc.name}: {result.meta['model']} on "
                                    f"{deployment_label(result.summary, result.meta['hardware'], sc.replicas)}"))
        files = ", ".join(f for f in written["files"] if f != "summary.json")
        kind = {"timeline": f"steps: a timeline per {written.get('timeline_s') or 0:g} s", "rows": "steps: a row per step",
                "none": "no step records"}[written["steps"]]
        console.print(f"records written to {dest}/ ({files}; {kind})"
                      + (f"\n  chosen: {written['why']}" if written["why"] else ""))


# Bounds that keep a step's arithmetic in int64 and its rows in memory
# (the same token bound as batchsim.workloads.config.MAX_TOKENS).
_MAX_TOKENS = 2**40
_MAX_BATCH = 1_000_000


@app.command()
def cost(
    model: Annotated[str, typer.Argument(help="model catalog name or config.json path")],
    hardware: Annotated[str, typer.Argument(help="hardware profile name or YAML path")],
    tp: Annotated[int, typer.Option(help="tensor-parallel size", min=1)] = 1,
    dtype: Annotated[str, typer.Option(help="weight dtype: bf16, fp16, fp8, int4")] = "bf16",
    prefill: Annotated[Optional[int], typer.Option(help="price a prefill of this many tokens", min=1, max=_MAX_TOKENS)] = None,
    decode: Annotated[Optional[int], typer.Option(help="price a decode step of this batch size", min=1, max=_MAX_BATCH)] = None,
    context: Annotated[Optional[int], typer.Option(help="context length of each decoding sequence", min=0, max=_MAX_TOKENS)] = None,
    graph_tokens: Annotated[Optional[int], typer.Option(
        help="price the step replayed from a CUDA graph captured at this many tokens (the dense operators "
             "run at it, attention and the LM head on the real rows)", min=1, max=_MAX_TOKENS)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Price one step operator by operator and show the KV capacity."""
    from batchsim.calibrate.report import cost_report, render_cost_table

    rep = cost_report(model, hardware, tp=tp, dtype=dtype, prefill=prefill, decode=decode, context=context,
                      graph_tokens=graph_tokens)
    if rep["kv_capacity_tokens"] is None:  # weights over memory: no deployment to price (it exited 0)
        raise InputError(rep["kv_capacity_error"])
    if as_json:
        typer.echo(json.dumps(rep, indent=2))
    else:
        Console().print(render_cost_table(rep))


def _register_commands() -> None:
    from batchsim.app.commands import register_all

    register_all(app)


_register_commands()


# click's ClickException: typer < 0.20 re-exports click's, later typers vendor
# their own copy (no ``click`` module to import), so find it from BadParameter.
_CLICK_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
_INTERRUPTED = "interrupted; finished results already written are kept"


def _fail(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True, markup=True)
    sys.exit(2)


def main() -> None:
    """Console-script entry point: maps input errors to exit code 2."""
    from rich.markup import escape

    try:
        rv = app(standalone_mode=False, prog_name="batchsim")
        if rv == 130:  # typer turns Ctrl-C into Exit(130), which standalone_mode=False returns
            err_console.print(_INTERRUPTED, highlight=False)
            sys.exit(130)
        if isinstance(rv, int) and rv:
            sys.exit(rv)
    except InputError as e:
        if _state["debug"]:
            raise
        _fail(escape(str(e)))
    except _CLICK_ERROR as e:  # bad usage: unknown option, missing argument, bad option value
        if _state["debug"]:
            raise
        message = e.format_message()
        if not message:  # no arguments at all: click printed the help
            sys.exit(2)
        ctx = getattr(e, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        _fail(escape(message + hint))
    except OSError as e:
        if _state["debug"]:
            raise
        name = f": {e.filename}" if e.filename else ""
        _fail(escape(f"{e.strerror or e}{name}"))
    except (KeyboardInterrupt, typer.Abort):
        _ignore_further_interrupts()
        err_console.print(_INTERRUPTED, highlight=False)
        sys.exit(130)
    except BaseException as e:  # a job's own Ctrl-C line (batchsim.app.workers.Interrupted): what it kept
        from batchsim.app.workers import Interrupted

        if not isinstance(e, Interrupted) or _state["debug"]:
            raise
        _ignore_further_interrupts()
        err_console.print(e.message, highlight=False, markup=False, soft_wrap=True)
        sys.exit(130)


def _ignore_further_interrupts() -> None:
    """After the first Ctrl-C is handled, a second one (a repeated key press) must not turn the
    one-line exit into a traceback from interpreter shutdown (the pool's thread join)."""
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread (an embedding caller): nothing to do
        pass


if __name__ == "__main__":  # pragma: no cover
    main()
