"""A progress bar for multi-run commands, on stderr, only where a person watches.

The bar is drawn with rich on stderr, so stdout stays clean for ``--json``
or pipes, and it is disabled when stderr is not a terminal or ``CI=true``
(logs in CI would fill with redraws). The environment is read when a bar is
made, never at import.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["progress", "progress_enabled"]


def progress_enabled() -> bool:
    """Whether a bar should be drawn: stderr is a TTY and CI is not set to true."""
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        return False
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


@contextmanager
def progress(total: int, description: str, enabled: bool | None = None) -> Iterator[Callable[[str], None]]:
    """Yield ``advance(label)``: call it once per finished run."""
    on = progress_enabled() if enabled is None else enabled
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("{task.fields[last]}"),
                   console=Console(stderr=True), disable=not on, transient=False)
    task = bar.add_task(description, total=total, last="")
    with bar:
        yield lambda label="": bar.update(task, advance=1, last=label)
