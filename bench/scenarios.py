"""The fixed benchmark scenarios: ShareGPT-like requests, two loads, four policies.

A benchmark case is (size, policy, load, replicas). Every case simulates
llama-3.1-8b on h100-sxm (a 128k context, so no ShareGPT prompt is
rejected) with Poisson arrivals and lognormal lengths fitted to the
Sarathi-Serve ShareGPT statistics (prompt median 1730 / p90 5696 tokens,
output median 415 / p90 834; capped at 8000 and 1000). The numbers are
written here, not read from a trace file, so the suite runs anywhere and a
scenario means the same thing in every result file.

Loads are fractions of one replica's saturation throughput per policy,
times the replica count: ``moderate`` is half of it, ``saturating`` twice
it (the queue grows for the whole run). NOTE: saturation is per policy,
because the padded policies serve ~7x fewer requests per second than the
iteration-level ones; one shared rate would make "moderate" a 3.5x overload
for static and dynamic. The values are fixed, measured once, and must not
follow the engine: if they did, a semantic change would silently change
what the benchmark times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import product
from typing import Iterable, Sequence

__all__ = ["MODEL", "HARDWARE", "PROMPT_TOKENS", "OUTPUT_TOKENS", "SATURATION_RPS", "LOADS",
           "POLICIES", "REPLICAS", "SIZES", "QUICK_SIZES", "BenchCase", "parse_sizes",
           "size_label", "make_cases"]

MODEL = "llama-3.1-8b"
HARDWARE = "h100-sxm"
PROMPT_TOKENS = {"dist": "lognormal", "median": 1730, "p90": 5700, "max": 8000}
OUTPUT_TOKENS = {"dist": "lognormal", "median": 415, "p90": 830, "max": 1000}
ROUTER = "least_outstanding"

# Served requests/s of ONE replica under overload (2000 requests arriving at
# 1000 req/s; engine d09a037, default policy knobs), rounded.
SATURATION_RPS = {"static": 0.95, "dynamic": 0.95, "continuous": 6.5, "chunked_prefill": 6.7}
LOADS = {"moderate": 0.5, "saturating": 2.0}
POLICIES = tuple(SATURATION_RPS)
REPLICAS = (1, 4)
SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (10_000,)

_SUFFIX = {"": 1, "k": 1_000, "m": 1_000_000}


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"10k,100k,1M"`` -> ``(10000, 100000, 1000000)``; plain integers too."""
    sizes = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKmM]?)", item)
        if m is None:
            raise ValueError(f"not a size: {item!r} (expected e.g. 10k, 100k, 1M or 2500)")
        n = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
        if n < 1 or n != int(n):
            raise ValueError(f"a size must be a positive whole number of requests, got {item!r}")
        sizes.append(int(n))
    if not sizes:
        raise ValueError("give at least one size, e.g. 10k,100k")
    return tuple(sorted(set(sizes)))


def size_label(n: int) -> str:
    """``10000 -> "10k"``, ``1000000 -> "1M"``, ``2500 -> "2500"``."""
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


@dataclass(frozen=True)
class BenchCase:
    """One benchmark scenario: how many requests, which policy, load and replicas."""

    size: int
    policy: str
    load: str
    replicas: int
    seed: int = 0

    @property
    def key(self) -> str:
        """Stable name used to match a case across result files."""
        return f"{size_label(self.size)}/{self.policy}/{self.load}/r{self.replicas}"

    @property
    def rate(self) -> float:
        """Offered load in requests/s for the whole cluster."""
        return SATURATION_RPS[self.policy] * LOADS[self.load] * self.replicas

    def scenario(self) -> dict:
        """The scenario mapping (validated by ``batchsim.app.config.scenario_from_dict`` in the child)."""
        return {
            "name": f"bench {self.key}",
            "model": MODEL,
            "hardware": HARDWARE,
            "replicas": self.replicas,
            "router": ROUTER,
            "policy": {"name": self.policy},
            "seed": self.seed,
            "workload": {
                "num_requests": self.size,
                "arrival": {"process": "poisson", "rate": self.rate},
                "prompt_tokens": dict(PROMPT_TOKENS),
                "output_tokens": dict(OUTPUT_TOKENS),
            },
            # NOTE: aggregate records keep memory bounded (batchsim/sim/aggregate.py):
            # what a user replaying a million requests would use.
            "measure": {"step_records": False, "records": "aggregate"},
        }


def _check(name: str, given: Iterable, allowed: Sequence) -> None:
    bad = [g for g in given if g not in allowed]
    if bad:
        raise ValueError(f"unknown {name} {', '.join(map(str, bad))}; expected one of "
                         f"{', '.join(map(str, allowed))}")


def make_cases(sizes: Sequence[int] = SIZES, policies: Sequence[str] = POLICIES,
               loads: Sequence[str] = tuple(LOADS), replicas: Sequence[int] = REPLICAS) -> list[BenchCase]:
    """Every combination, smallest size first (a timeout late in a run costs the least)."""
    _check("policy", policies, POLICIES)
    _check("load", loads, tuple(LOADS))
    if any(r < 1 for r in replicas):
        raise ValueError(f"replica counts must be >= 1, got {list(replicas)}")
    return [BenchCase(s, p, ld, r)
            for s, p, ld, r in product(sorted(sizes), policies, loads, replicas)]
