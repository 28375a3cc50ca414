"""``batchsim examples``: the packaged example scenarios and baselines.

Thin: lists them, prints one, or writes one or all of them to a folder, through
:mod:`batchsim.app.examples`. A clash with an existing file (without ``--force``)
or an unknown name is an :class:`batchsim.sim.errors.InputError` (exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

__all__ = ["register", "examples_command"]


def _listing() -> str:
    from batchsim.app.examples import list_baselines, list_examples, other_files

    examples, baselines = list_examples(), list_baselines()
    width = max(len(e.name) for e in examples + baselines) + 2
    lines = ["Example scenarios (batchsim examples NAME prints one, --out DIR writes DIR/NAME.yaml):"]
    lines += [f"  {e.name:<{width}}{e.description}" for e in examples]
    lines += ["", "Regression baselines (batchsim regress baselines/*.yaml --baseline baselines/baseline.json):"]
    lines += [f"  {e.name:<{width}}{e.description}" for e in baselines]
    lines += ["", "Other files:"]
    lines += [f"  {f}" for f in other_files()]
    lines += ["", "batchsim examples --all --out DIR writes DIR/examples/ and DIR/baselines/; "
              "the README's commands then work from DIR."]
    return "\n".join(lines)


def examples_command(
    name: Annotated[Optional[str], typer.Argument(help="example to print or write (see the list without NAME)")] = None,
    out: Annotated[Optional[Path], typer.Option(help="write to this folder instead of printing")] = None,
    all_: Annotated[bool, typer.Option("--all", help="write every example and baseline to --out DIR")] = False,
    force: Annotated[bool, typer.Option("--force", help="overwrite existing files")] = False,
) -> None:
    """List the packaged example scenarios and baselines; print one or write them to a folder."""
    from batchsim.app.examples import example_text, write_all, write_example
    from batchsim.sim.errors import InputError

    if all_:
        if name is not None:
            raise InputError("give NAME or --all, not both", "batchsim examples")
        if out is None:
            raise InputError("--all writes files: give --out DIR (e.g. --out .)", "batchsim examples")
        written = write_all(out, force=force)
        typer.echo(f"wrote {len(written)} files to {out / 'examples'}/ and {out / 'baselines'}/")
    elif name is None:
        if out is not None:
            raise InputError("--out needs NAME or --all", "batchsim examples")
        typer.echo(_listing())
    elif out is not None:
        typer.echo(f"wrote {write_example(name, out, force=force)}")
    else:
        typer.echo(example_text(name), nl=False)


def register(app: typer.Typer) -> None:
    """Add ``examples`` to the ``batchsim`` app."""
    app.command("examples")(examples_command)
