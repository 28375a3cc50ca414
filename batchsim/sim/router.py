"""Routers: which replica gets an arriving request.

Small strategies as functions (Ciw style). :func:`make_router` returns a
callable ``route(replicas, seq) -> index``; stateful ones (round robin, the
power-of-two sampler) close over their own counter or generator.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from batchsim.sim.errors import InputError

__all__ = ["make_router", "ROUTERS"]

Route = Callable[[Sequence, object], int]


def _round_robin(_rng: np.random.Generator) -> Route:
    counter = [0]

    def route(replicas, seq) -> int:
        i = counter[0] % len(replicas)
        counter[0] += 1
        return i

    return route


def _load(replica) -> tuple[int, int]:
    """Outstanding requests, ties broken by index (deterministic)."""
    return replica.outstanding, replica.index


def _least_outstanding(_rng: np.random.Generator) -> Route:
    def route(replicas, seq) -> int:
        return min(replicas, key=_load).index

    return route


def _power_of_two(rng: np.random.Generator) -> Route:
    def route(replicas, seq) -> int:
        if len(replicas) == 1:
            return 0
        a, b = rng.choice(len(replicas), size=2, replace=False)
        return min(replicas[int(a)], replicas[int(b)], key=_load).index

    return route


# SGLang's model gateway, cache-aware policy (lightseekorg/smg model_gateway/src/policies/cache_aware.rs and
# CacheAwareConfig's defaults in policies/mod.rs): load is imbalanced when max - min > 32 requests and
# max > 1.1 x min, and then the least loaded replica wins.
CACHE_AWARE_ABS = 32
CACHE_AWARE_REL = 1.1


def _cache_aware(_rng: np.random.Generator) -> Route:
    """The gateway's event-driven mode, which reads each backend's real KV state: when load is
    balanced, the replica holding the longest cached prefix of the prompt, ties to the less loaded
    then the smaller cache; with no overlap, or when load is imbalanced, the least loaded. Without
    prefix caching no replica holds a prefix: least outstanding."""

    def route(replicas, seq) -> int:
        loads = [r.outstanding for r in replicas]
        lo, hi = min(loads), max(loads)
        if hi - lo > CACHE_AWARE_ABS and hi > CACHE_AWARE_REL * lo:
            return min(replicas, key=_load).index
        hashes = getattr(seq, "prefix_hashes", None)
        best, key = None, None
        for r in replicas:
            units = r.kv.resident_units(hashes) if hashes else 0
            k = (-units, r.outstanding, r.kv.cached_units, r.index)
            if key is None or k < key:
                best, key = r, k
        if key[0] == 0:
            return min(replicas, key=_load).index
        return best.index

    return route


def _least_kv(_rng: np.random.Generator) -> Route:
    def route(replicas, seq) -> int:
        return min(replicas, key=lambda r: (r.kv.used_blocks / r.kv.total_blocks,
                                            r.queued, r.index)).index

    return route


ROUTERS: dict[str, Callable[[np.random.Generator], Route]] = {
    "round_robin": _round_robin,
    "least_outstanding": _least_outstanding,
    "power_of_two": _power_of_two,
    "least_kv": _least_kv,
    "cache_aware": _cache_aware,
}


def make_router(name: str, rng: np.random.Generator) -> Route:
    """Build the router called ``name``."""
    try:
        return ROUTERS[name](rng)
    except KeyError:
        raise InputError(f"unknown router {name!r}; expected one of {', '.join(ROUTERS)}",
                         "router") from None
