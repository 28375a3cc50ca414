"""Where independent simulations run: in this process, a local process pool, or Ray.

Every sweep (compare with seeds, sweep over rates, plan) is a list of
independent tasks ``fn(arg) -> result``. :func:`run_tasks` runs them and
yields ``(index, result)`` as each finishes, so callers can store finished
points at once (a killed sweep keeps them). Results are keyed by index, so
the order they finish in never changes an output.

Ctrl-C: pool workers ignore SIGINT, so only this process sees it; when the
consumer stops (a KeyboardInterrupt, any exception, or closing the iterator)
the pending tasks are cancelled and the workers killed at once, without
waiting for the running simulations. A job that catches the interrupt raises
:class:`Interrupted` (made by :func:`interrupted`) saying what it kept; the
CLI prints that line and exits 130.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from batchsim.sim.errors import InputError

__all__ = ["run_tasks", "default_workers", "EXECUTORS", "Interrupted", "interrupted"]

EXECUTORS = ("local", "serial", "ray")


class Interrupted(BaseException):
    """A Ctrl-C a job caught and handled: ``message`` says what it kept.

    The ``batchsim`` CLI prints the message as one line and exits 130.
    NOTE: not a KeyboardInterrupt subclass on purpose: typer turns a KeyboardInterrupt
    into a bare exit code 130, which would lose the message. Like KeyboardInterrupt it
    is a BaseException, so ``except Exception`` never swallows it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def interrupted(kept: int, folder: str | Path | None, what: str = "finished point") -> Interrupted:
    """The exception a job raises on Ctrl-C: ``kept`` results stored in ``folder``.

    ``interrupted(12, "runs/plan-x/points")`` says "interrupted: 12 finished points kept in
    runs/plan-x/points; rerun the same command to resume". Use it as
    ``except KeyboardInterrupt: raise interrupted(n, points_dir) from None``.
    """
    noun = what if kept == 1 else f"{what}s"
    if folder is None:
        return Interrupted(f"interrupted: {kept} {noun} not stored (no output folder)")
    return Interrupted(f"interrupted: {kept} {noun} kept in {folder}; rerun the same command to resume")


def default_workers() -> int:
    """One worker per core (a simulation is single-threaded)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def _serial(fn, args) -> Iterator[tuple[int, Any]]:
    for i, a in enumerate(args):
        yield i, fn(a)


def _worker_init() -> None:
    """Pool worker start-up: ignore Ctrl-C (the parent handles it and stops the workers), and
    on Linux die with the parent (a SIGTERM or kill of the parent alone left them running)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _die_with_parent() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGKILL): the kernel kills this worker when its parent exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # no libc symbol: best effort, the parent still stops its pool
        pass


@contextmanager
def _sigint_held():
    """Hold SIGINT back while the pool starts its processes: a worker inherits the blocked
    signal (and ignores it from its initializer on), so a Ctrl-C during start-up never reaches
    a worker before it ignores SIGINT; here the held signal is delivered on leaving."""
    hold = hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
    if hold:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if hold:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Stop the pool now: cancel its pending tasks and kill its workers (running tasks are lost).

    NOTE: Python 3.11's ProcessPoolExecutor has no public way to stop running tasks
    (``terminate_workers`` arrives in 3.14); its private ``_processes`` (pid -> Process)
    is the only handle, read here alone (before ``shutdown``, which drops it) and
    skipped if it is gone. The futures are cancelled by ``shutdown(cancel_futures=True)``,
    not here: the pool's manager thread sets BrokenProcessPool on the pending tasks it
    still holds once its workers die, and a future cancelled behind its back makes it
    raise InvalidStateError (a thread traceback on stderr).
    """
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)  # (shutdown drops it too)
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        try:
            p.kill()
        except (OSError, ValueError, AttributeError):
            pass
    for p in procs:
        try:
            p.join(1.0)
        except (OSError, ValueError, AttributeError, AssertionError):
            pass
    # NOTE: once its workers are gone the manager thread closes its wake-up pipe; if the
    # interpreter exits meanwhile, concurrent.futures' exit hook writes to that pipe as it closes
    # (Python 3.11 takes no lock there) and prints "Exception ignored ... Bad file descriptor"
    # with a traceback after the interrupt's message. Waiting for the thread (bounded: it has
    # nothing left but to close) lets the hook see the pipe closed.
    if manager is not None:
        try:
            manager.join(1.0)
        except (RuntimeError, AttributeError):
            pass


def _local(fn, args, workers: int) -> Iterator[tuple[int, Any]]:
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_worker_init)
    futures: dict = {}
    try:
        with _sigint_held():
            for i, a in enumerate(args):
                futures[pool.submit(fn, a)] = i
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=lambda f: futures[f]):
                yield futures[f], f.result()
    except BaseException:  # Ctrl-C, a failed task, or the consumer closing us: stop at once
        _stop_pool(pool)
        raise
    pool.shutdown(wait=True)


def _ray(fn, args, address: str | None) -> Iterator[tuple[int, Any]]:
    try:
        import ray
    except ImportError:
        raise InputError("--executor ray needs Ray: pip install 'batchsim[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 ignore_reinit_error=True)
    remote = ray.remote(fn)
    refs = {remote.remote(a): i for i, a in enumerate(args)}
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for r in done:
                yield refs[r], ray.get(r)
    except BaseException:  # Ctrl-C or a failed task: cancel what has not finished
        for r in pending:
            with suppress(Exception):  # best effort: a ref that finished meanwhile
                ray.cancel(r, force=True)
        raise


def run_tasks(fn: Callable[[Any], Any], args: Sequence[Any], executor: str = "local",
              workers: int | None = None, ray_address: str | None = None) -> Iterator[tuple[int, Any]]:
    """Run ``fn`` over ``args``; yield ``(index, result)`` as each finishes.

    ``fn`` must be a module-level function (picklable). With one task or one
    worker, ``local`` runs in-process (no pool start-up cost). Close the iterator
    (``contextlib.closing``) when stopping early: a process pool's workers are
    killed then, not when the iterator is garbage-collected.
    """
    if executor not in EXECUTORS:
        raise InputError(f"unknown executor {executor!r}; expected one of {', '.join(EXECUTORS)}",
                         "--executor")
    n = workers or default_workers()
    if executor == "serial" or (executor == "local" and (n == 1 or len(args) <= 1)):
        return _serial(fn, args)
    if executor == "local":
        return _local(fn, args, min(n, len(args)))
    return _ray(fn, args, ray_address)
