"""When a measured window has enough requests to judge: light, so the CLI can import it.

The summary (:mod:`batchsim.sim.metrics`) warns below :data:`MIN_REQUESTS`
completed requests in the measured window; ``batchsim plan`` and ``batchsim
regress`` call such a point *not evaluable* (``--min-requests``).
"""

from __future__ import annotations

__all__ = ["MIN_REQUESTS", "thin_window"]

MIN_REQUESTS = 100
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
