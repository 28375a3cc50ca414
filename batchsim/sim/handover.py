"""A worker thread that can be stopped wherever a Ctrl-C lands: the one statement of the
hand-over the compiled core's thread, the ITL read-ahead and the Parquet writer use.

The worker is started by ``_thread``'s one call in C. (``threading.Thread.start`` waits on a
``Condition`` in Python, which an exception raised by a signal handler as it takes its lock back
leaves unbalanced: ``RuntimeError: release unlocked lock`` in place of the ``KeyboardInterrupt``;
and an interrupt before the launch leaves a Thread that ``join`` refuses and ``is_alive``
denies.) The stop is two flags, each set by one side, in this order: the worker sets ``began``
and then reads ``stop``; the stopper sets ``stop`` and then reads ``began``. Under the GIL each is
one store or load, which no signal handler splits, so a worker the stopper saw not begun sees
``stop`` and runs nothing of its function, and one it saw begun is waited for until ``done``, its
last act (after which it touches nothing of its owner's). Right wherever an interrupt lands in
the start, before or after the launch.
"""

from __future__ import annotations

import _thread
import time
from typing import Any, Callable

__all__ = ["Handover"]


class Handover:
    """One worker: :meth:`start` it, poll :attr:`stop` inside its function, and :meth:`halt`
    then :meth:`wait` to stop it."""

    __slots__ = ("began", "stop", "done", "launched", "ident")

    def __init__(self) -> None:
        self.began = self.stop = self.done = self.launched = False
        self.ident: int | None = None  # the worker's thread, once it began

    def start(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on a new thread (its exceptions are its own to hand over)."""
        _thread.start_new_thread(self._run, (fn, args))
        self.launched = True

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            self.ident = _thread.get_ident()
            self.began = True
            if self.stop:
                return
            fn(*args)
        finally:
            self.done = True

    def halt(self) -> bool:
        """Ask the worker to stop; whether it began (then wake it if it waits, and :meth:`wait`).
        A worker that had not begun never runs its function."""
        self.stop = True
        return self.began

    def wait(self, tick: float = 0.002) -> None:
        """Until the worker is done, where one began or was launched (polled every ``tick``
        seconds: not a Condition's wait, which an interrupt can leave locked). On the worker's
        own thread (its owner's cleanup run there, as a garbage collection can) it returns at once:
        the worker is done once that cleanup returns."""
        if self.ident == _thread.get_ident():
            return
        while not self.done and (self.began or self.launched):
            time.sleep(tick)
