"""Means with 95% confidence intervals over independent seeds.

A metric repeated over n independent seeds is reported as
``mean ± t(0.975, n-1) · s / sqrt(n)`` (Student's t, ``s`` the sample standard
deviation). The t quantiles come from a table, not scipy, so the numbers are
the same wherever batchsim runs and scipy is not a dependency.
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Sequence

import numpy as np

__all__ = ["t975", "t_sf", "mean_ci", "aggregate", "CI_SUFFIX"]

CI_SUFFIX = "_ci95"

# t(0.975, df) for df = 1..30 (computed with mpmath to 6 decimals).
_T975 = (
    12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004,
    2.262157, 2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905,
    2.109816, 2.100922, 2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899,
    2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272,
)
_Z975 = 1.959963984540054


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    # NOTE: past the table, the Cornish-Fisher expansion in 1/df is exact to
    # ~2e-6 at df = 31 and better beyond; a bigger table would buy nothing.
    z = _Z975
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` > 0 degrees of freedom (real df: Welch's).

    Through the regularized incomplete beta function, ``P(|T| > |t|) = I_x(df/2, 1/2)``
    with ``x = df / (df + t^2)``, evaluated by its continued fraction (Lentz's method), so
    p-values need no scipy and are the same bits wherever batchsim runs."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t > 0 else 1.0 - tail


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def mean_ci(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """``(mean, half-width of the 95% CI)``; the half-width is NaN for n < 2."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return math.nan, math.nan
    mean = float(v.mean())
    if len(v) < 2:
        return mean, math.nan
    return mean, float(t975(len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def _numeric(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _seed_warnings(per_seed: Sequence) -> list[str]:
    """Each kind of warning once (its first seed's words), with how many seeds gave it."""
    first: dict[str, str] = {}
    count: dict[str, int] = {}
    for ws in per_seed:
        for kind in dict.fromkeys(_NUMBER.sub("N", w) for w in (ws or ())):
            count[kind] = count.get(kind, 0) + 1
        for w in ws or ():
            first.setdefault(_NUMBER.sub("N", w), w)
    return [f"{w} ({count[k]} of {len(per_seed)} seeds)" for k, w in first.items()]


def aggregate(summaries: Iterable[dict]) -> dict:
    """Average summaries of one configuration over seeds.

    Numeric keys become their mean followed by ``<key>_ci95`` (the CI's
    half-width); a numeric key that is None (a null latency) in any seed is
    None, CI too: a mean over the other seeds would hide that one had no
    measured request. ``warnings`` has each kind of warning once, with how
    many seeds gave it; ``rejected_by_reason`` is the mean count per kind; other keys (the
    policy name) are taken from the first summary. Key order follows the
    first summary, so CSV columns are stable.
    """
    rows = list(summaries)
    if not rows:
        raise ValueError("nothing to aggregate")
    out: dict = {}
    for key, first in rows[0].items():
        values = [r.get(key) for r in rows]
        if key == "warnings":
            out[key] = _seed_warnings(values)
        elif key == "rejected_by_reason":
            kinds = dict.fromkeys(k for v in values for k in (v or {}))
            out[key] = {k: sum(float((v or {}).get(k, 0)) for v in values) / len(rows) for k in kinds}
        elif any(_numeric(v) for v in values) or (first is None and key.endswith("_ms")):
            if any(v is None for v in values):
                out[key], out[key + CI_SUFFIX] = None, None
                continue
            mean, half = mean_ci([float(v) for v in values])
            out[key] = mean
            out[key + CI_SUFFIX] = half
        else:
            out[key] = first
    return out
