"""When a measurement is enough to judge: light, so the CLI can import it.

The summary (:mod:`batchsim.sim.metrics`) warns below :data:`MIN_REQUESTS`
completed requests in the measured window; ``batchsim plan`` and ``batchsim
regress`` call such a point *not evaluable* (``--min-requests``).
:data:`DEFAULT_SEEDS` is how many seeds compare, sweep and plan give an answer over.
"""

from __future__ import annotations

__all__ = ["SHORT_SPANS", "TAIL_SPANS", "steady_share", "e2e_spans", "MIN_REQUESTS", "DEFAULT_SEEDS", "DEFAULT_MAX_SEEDS", "DEFAULT_CI_WIDTH", "thin_window"]

DEFAULT_SEEDS = 3
"""Seeds compare and sweep run per configuration, and plan starts each point with.

Three is the fewest whose 95% t-interval is usable: t(0.975, 2) = 4.30, where two
seeds give 12.7. Seed i is ``scenario.seed + i`` for every policy, rate and
configuration (common random numbers: differences are sharper than levels).
(regress uses its own count, :data:`batchsim.app.regress.DEFAULT_SEEDS`, for its paired tests.)
"""

DEFAULT_MAX_SEEDS = 10
"""The most seeds a plan point grows to while an SLO metric's interval is too wide."""

DEFAULT_CI_WIDTH = 0.10
"""The half-width a plan asks of each SLO metric's 95% interval, relative to its mean."""

MIN_REQUESTS = 100
"""Fewest completed requests in the measured window for its latencies to be evaluable.

Why 100: numpy's p99 of ``n`` samples sits at sorted rank ``0.99 (n - 1)``. At
100 samples that is 99% the second-largest sample; with fewer it slides toward
the single largest one, so the "p99" is one outlier, not a percentile. Below
this, ``summarize`` warns, and ``batchsim plan`` (``--min-requests``) and
``batchsim regress`` (``--min-requests``) call the point *not evaluable*.
"""

# A load whose window of arrivals spans fewer E2E times than this is short: an overloaded replica's
# queue grows by (rate / capacity - 1) x the span, so over a few E2Es it delays requests by less
# than one more E2E, and the tokens in flight at the window's ends weigh on its served share (a
# 100-request window read 76% served just above 49 req/s, where 2,000-request runs keep up to about
# 60): plan flags such a capacity, sweep such a saturation point (SHORT).
SHORT_SPANS = 10.0

# ... nor one that spans fewer p99 E2E times than this: the requests in flight (and so the running batch
# and the KV cache they hold) reach their steady mix only once the longest-lived requests have come and
# gone, so a window not several of their lifetimes long measures the ramp-up. With a long-tailed output
# (examples/plan-chat.yaml: median E2E 5 s, p99 40 s) 1,305 requests at 17 req/s, 10.8 median E2Es,
# met p99 TTFT 1.5 s with a flat TTFT from the first quarter of the window to the last, where 5,000-request
# runs at 17 req/s break it (1.5-6.9 s) and 20,000-request runs already at 16.5 (scripts/steady_check.py).
TAIL_SPANS = 5.0


def steady_share(span_s, median_e2el_ms, p99_e2el_ms) -> float | None:
    """A span of arrivals over the span a steady state needs, :data:`SHORT_SPANS` median E2E times and
    :data:`TAIL_SPANS` p99 E2E times (either alone when the other is missing): under 1 the window is
    short (SHORT). None without a span or any E2E."""
    span = _positive(span_s)
    needs = [k * e / 1000.0 for k, e in ((SHORT_SPANS, _positive(median_e2el_ms)), (TAIL_SPANS, _positive(p99_e2el_ms)))
             if e is not None]
    return span / max(needs) if span is not None and needs else None


def e2e_spans(span_s, median_e2el_ms) -> float | None:
    """How many median E2E times a span of arrivals lasts, to hold against :data:`SHORT_SPANS`;
    None without both, or with no E2E."""
    span, e2el = _number(span_s), _positive(median_e2el_ms)
    return span / (e2el / 1000.0) if span is not None and e2el is not None else None


def _number(v) -> float | None:
    """``v`` as a float; None when it is not a number or is NaN."""
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if v == v else None


def _positive(v) -> float | None:
    """``v`` as a float when it is a number above 0, else None."""
    v = _number(v)
    return v if v is not None and v > 0 else None


def thin_window(completed: int, min_requests: int = MIN_REQUESTS) -> str:
    """Why a window of ``completed`` latency samples is not evaluable ("" when it is)."""
    if completed >= min_requests:
        return ""
    return (f"only {completed} requests completed in the measured window, fewer than {min_requests}: "
            f"a p99 over so few is about the maximum, not a percentile")
