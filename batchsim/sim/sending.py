"""How a saved ``vllm bench serve`` (or SGLang ``bench_serving``) run sent its requests.

One rule, read by both readers of those files: ``batchsim calibrate --from-bench``
(:mod:`batchsim.calibrate.bench`, which replays a run to fit overheads) and the
``vllm_bench`` trace (:mod:`batchsim.workloads.traces`, which replays its lengths and,
with ``arrivals_from: recorded``, its arrivals). vLLM's client sends request *i* when its
arrival process says (gamma gaps at ``request_rate``, or all at once at ``inf``), and with
``--max-concurrency`` only while fewer than that many are in flight (a semaphore around
each request: ``benchmarks/serve.py``'s ``limited_request_func``).
"""

from __future__ import annotations

import math

__all__ = ["CLOSED", "BURST", "SAVED", "RATE", "NEITHER", "sending"]

CLOSED = "closed"  # infinite rate, capped in flight: a closed loop of max_concurrency clients
BURST = "burst"  # infinite rate, no cap: every request sent at once
SAVED = "saved"  # finite rate, send times saved (start_times): replay them
RATE = "rate"  # finite rate, no send times, no cap: the times are a gamma draw at the rate
NEITHER = "neither"  # finite rate, capped, no send times: neither loop; the arrivals cannot be made


def sending(rate: float, max_concurrency: int | None, has_start_times: bool) -> str:
    """Which of the five ways above the run sent its requests. A closed loop's send times
    follow from the server's completions, so a closed run is one even where its file saved
    them (they are the old server's, not the simulated one's)."""
    if not math.isfinite(rate):
        return CLOSED if max_concurrency is not None else BURST
    if has_start_times:
        return SAVED
    return RATE if max_concurrency is None else NEITHER
