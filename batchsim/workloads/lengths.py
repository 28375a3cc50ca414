"""Token-length distributions: prompt and output lengths as int64 arrays >= 1.

Each distribution is one function ``(cfg, n, rng) -> int64[n]``. Draws are
rounded to whole tokens and clipped: never below 1 (a request has at least
one prompt token and produces at least one output token), and for the
lognormal to its ``[min, max]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from batchsim.sim.errors import InputError

from . import _io
from .config import MAX_TOKENS, EmpiricalLength, FixedLength, LengthConfig, LognormalLength, UniformLength

__all__ = ["sample", "fixed", "uniform", "lognormal", "empirical", "lognormal_sigma", "Z90"]

Z90 = 1.2815515655446004
"""The standard normal's 90th percentile: p90 = median * exp(sigma * Z90)."""


def lognormal_sigma(median: float, p90: float) -> float:
    """The log-space standard deviation that puts the 90th percentile at ``p90``."""
    return float(np.log(p90 / median) / Z90)


def fixed(cfg: FixedLength, n: int, rng: np.random.Generator) -> np.ndarray:
    """``value`` for every request."""
    return np.full(n, cfg.value, dtype=np.int64)


def uniform(cfg: UniformLength, n: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform integers in ``[min, max]``, both inclusive."""
    return rng.integers(cfg.min, cfg.max, size=n, endpoint=True, dtype=np.int64)


def lognormal(cfg: LognormalLength, n: int, rng: np.random.Generator) -> np.ndarray:
    """Lognormal by median and p90, rounded to the nearest token, clipped to [min, max].

    NOTE: clipping (not resampling) puts the tail's mass on ``max``, as a server
    that truncates at its context length would; the median and p90 are exact
    as long as they lie inside [min, max].
    """
    x = rng.lognormal(np.log(cfg.median), lognormal_sigma(cfg.median, cfg.p90), size=n)
    hi = float(cfg.max) if cfg.max is not None else float(MAX_TOKENS)
    return np.rint(np.clip(x, cfg.min, hi)).astype(np.int64)


def empirical(cfg: EmpiricalLength, n: int, rng: np.random.Generator, base_dir: Path | None = None) -> np.ndarray:
    """Draw with replacement from a column of a CSV/JSONL file; zeros become 1."""
    path = _io.resolve(cfg.path, base_dir)
    table = _io.read_table(path, [cfg.column], cfg.format)
    values = _io.tokens(table, cfg.column)
    if len(values) == 0:
        raise InputError(f"no values in column '{cfg.column}'; expected at least one row", str(path))
    return np.maximum(rng.choice(values, size=n), 1)


def sample(cfg: LengthConfig, n: int, rng: np.random.Generator, base_dir: Path | None = None) -> np.ndarray:
    """``n`` lengths from ``cfg``: int64, every value >= 1."""
    if cfg.dist == "empirical":
        return empirical(cfg, n, rng, base_dir)
    out = {"fixed": fixed, "uniform": uniform, "lognormal": lognormal}[cfg.dist](cfg, n, rng)
    return np.maximum(out, 1)
