"""When a measurement is enough to judge: light, so the CLI can import it.

The summary (:mod:`batchsim.sim.metrics`) warns below :data:`MIN_REQUESTS`
completed requests in the measured window; ``batchsim plan`` and ``batchsim
regress`` call such a point *not evaluable* (``--min-requests``).
:data:`DEFAULT_SEEDS` is how many seeds compare, sweep and plan give an answer over.
"""

from __future__ import annotations

__all__ = ["SHORT_SPANS", "e2e_spans", "MIN_REQUESTS", "DEFAULT_SEEDS", "DEFAULT_MAX_SEEDS", "DEFAULT_CI_WIDTH", "thin_window"]

DEFAULT_SEEDS = 3
"""Seeds compare and sweep run per configuration, and plan starts each point with.

Three is the fewest whose 95% t-interval is usable: t(0.975, 2) = 4.30, where two
seeds give 12.7. Seed i is ``scenario.seed + i`` for every policy, rate and
configuration (common random numbers: differences are sharper than levels).
(regress uses 5, :data:`batchsim.app.regress.DEFAULT_SEEDS`, for its sign test.)
"""

DEFAULT_MAX_SEEDS = 10
"""The most seeds a plan point grows to while an SLO metric's interval is too wide."""

DEFAULT_CI_WIDTH = 0.10
"""The half-width a plan asks of each SLO metric's 95% interval, relative to its mean."""

MIN_REQUESTS = 100
# A load whose window of arrivals spans fewer E2E times than this is short: an overloaded replica's
# queue grows by (rate / capacity - 1) x the span, so over a few E2Es it delays requests by less
# than one more E2E, and the tokens in flight at the window's ends weigh on its served share (a
# 100-request window read 76% served just above 49 req/s, where 2,000-request runs keep up to about
# 60): plan flags such a capacity, sweep such a saturation point (SHORT).
SHORT_SPANS = 10.0


def e2e_spans(span_s, median_e2el_ms) -> float | None:
    """How many median E2E times a span of arrivals lasts, to hold against :data:`SHORT_SPANS`;
    None without both, or with no E2E."""
    try:
        span, e2el = float(span_s), float(median_e2el_ms)
    except (TypeError, ValueError):
        return None
    return span / (e2el / 1000.0) if span == span and e2el > 0 else None
"""Fewest completed requests in the measured window for its latencies to be evaluable.

Why 100: numpy's p99 of ``n`` samples sits at sorted rank ``0.99 (n - 1)``. At
100 samples that is 99% the second-largest sample; with fewer it slides toward
the single largest one, so the "p99" is one outlier, not a percentile. Below
this, ``summarize`` warns, and ``batchsim plan`` (``--min-requests``) and
``batchsim regress`` (``--min-requests``) call the point *not evaluable*.
"""


def thin_window(completed: int, min_requests: int = MIN_REQUESTS) -> str:
    """Why a window of ``completed`` latency samples is not evaluable ("" when it is)."""
    if completed >= min_requests:
        return ""
    return (f"only {completed} requests completed in the measured window, fewer than {min_requests}: "
            f"a p99 over so few is about the maximum, not a percentile")
