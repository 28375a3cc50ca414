"""Where independent simulations run: in this process, a local process pool, or Ray.

Every sweep (compare with seeds, sweep over rates, plan) is a list of
independent tasks ``fn(arg) -> result``. :func:`run_tasks` runs them and
yields ``(index, result)`` as each finishes, so callers can store finished
points at once (a killed sweep keeps them). Results are keyed by index, so
the order they finish in never changes an output.
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterator, Sequence

from batchsim.sim.errors import InputError

__all__ = ["run_tasks", "default_workers", "EXECUTORS"]

EXECUTORS = ("local", "serial", "ray")


def default_workers() -> int:
    """One worker per core (a simulation is single-threaded)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def _serial(fn, args) -> Iterator[tuple[int, Any]]:
    for i, a in enumerate(args):
        yield i, fn(a)


def _local(fn, args, workers: int) -> Iterator[tuple[int, Any]]:
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(fn, a): i for i, a in enumerate(args)}
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in sorted(done, key=lambda f: futures[f]):
                    yield futures[f], f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise


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
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for r in done:
            yield refs[r], ray.get(r)


def run_tasks(fn: Callable[[Any], Any], args: Sequence[Any], executor: str = "local",
              workers: int | None = None, ray_address: str | None = None) -> Iterator[tuple[int, Any]]:
    """Run ``fn`` over ``args``; yield ``(index, result)`` as each finishes.

    ``fn`` must be a module-level function (picklable). With one task or one
    worker, ``local`` runs in-process (no pool start-up cost).
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
