"""Running the CLI as a user's terminal does, for the tests that interrupt it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any


def ctrl_c_when(cmd: Sequence[str], ready: Callable[[], bool], at_ready: Callable[[subprocess.Popen], Any] | None = None,
                wait_s: float = 120.0) -> tuple[subprocess.Popen, str, str, float, Any]:
    """Start ``cmd`` in its own process group, wait until ``ready()`` (failing if it exits first or
    ``wait_s`` passes), call ``at_ready(p)``, then send SIGINT to the whole group, as a terminal's
    Ctrl-C does. Returns the process, its stdout and stderr, the seconds it took to exit after the
    signal, and what ``at_ready`` returned. The group is killed if anything fails on the way."""
    t0 = time.monotonic()
    # (SIGINT's default action in the child, whatever this process does with it)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509
    try:
        while not ready():
            assert p.poll() is None and time.monotonic() - t0 < wait_s, p.communicate()
            time.sleep(0.05)
        seen = at_ready(p) if at_ready is not None else None
        t1 = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        stdout, err = p.communicate(timeout=60)
        return p, stdout, err, time.monotonic() - t1, seen
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def run_cli(capsys, monkeypatch, *args: str, columns: int | None = None) -> tuple[int, str, str]:
    """Run the console script in-process: (exit code, stdout, stderr). ``columns``: the terminal
    width rich lays its tables out for."""
    import sys

    from batchsim.app.cli import main

    monkeypatch.setattr(sys, "argv", ["batchsim", *args])
    if columns is not None:
        monkeypatch.setenv("COLUMNS", str(columns))
    try:
        main()
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
