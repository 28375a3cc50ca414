"""Summary metrics from records, with ``vllm bench serve``'s key names.

Latency percentiles are over the requests in the measured window (arrival in
``[warmup_s, last_arrival - cooldown_s]``); ITL percentiles over every gap
of those requests. Utilization is over the whole simulated time of all
replicas. See DESIGN.md "Semantics everyone must agree on".

A latency statistic no measured request has (an empty measured window, or no
request with two tokens for TPOT) is ``None`` (null in JSON, empty in CSV),
never 0. ``warnings`` says why in words, and says when the window is too thin
to trust a p99 (:data:`MIN_REQUESTS`). ``rejected_by_reason`` counts the
measured window's rejections by kind (:func:`rejection_kind`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from batchsim.sim.aggregate import StepTotals
from batchsim.sim.itl import EmptyError, ItlRecords, weighted_summary
from batchsim.sim.measure import MIN_REQUESTS, SHORT_SPANS, TAIL_SPANS, steady_share, thin_window
from batchsim.sim.state import COMPLETED, REJECTED, UNFINISHED
from batchsim.sim.table import column

__all__ = ["RunTotals", "summarize", "closed_loop_throughput", "pool_utilization", "ms_stats", "weighted_stats", "ms_piece", "measured_gaps", "PERCENTILES", "LATENCY_METRICS", "MIN_REQUESTS", "rejection_kind",
           "rejections_by_kind", "latency_keys", "thin_window"]

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


# The kinds of rejection reasons the engine and the built-in policies give
# (batchsim.sim.engine too_long/over_kv/queue_full, batchsim.policies.step over_budget;
# the compiled core gives the same words), matched without their numbers.
_KINDS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"^prompt\+output \d+ > max_model_len \d+$"), "over max_model_len"),
    (re.compile(r"^prompt\+output \d+ tokens > KV capacity \d+$"), "over KV capacity"),
    (re.compile(r"^queue full \(\d+ waiting\)$"), "queue full"),
    (re.compile(r"^needs \d+ tokens in one step but max_num_batched_tokens is \d+$"),
     "over max_num_batched_tokens"),
)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def rejection_kind(reason: str) -> str:
    """A rejection reason without its numbers: ``"over max_num_batched_tokens"``,
    ``"over max_model_len"``, ``"over KV capacity"``, ``"queue full"``; any other
    reason (a plugin's) with each number replaced by ``N``."""
    text = str(reason or "").strip()
    for pattern, kind in _KINDS:
        if pattern.match(text):
            return kind
    return _NUMBER.sub("N", text) or "no reason given"


def rejections_by_kind(reasons) -> dict[str, int]:
    """``{kind: count}`` of rejection reasons, most frequent first (then by name)."""
    counts: dict[str, int] = {}
    for r in reasons:
        k = rejection_kind(r)
        counts[k] = counts.get(k, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def latency_keys() -> tuple[str, ...]:
    """Every summary latency key that is None when no measured request has it."""
    keys = [f"{s}_{m}_ms" for m in LATENCY_METRICS
            for s in ("mean", "std", *("median" if p == 50 else f"p{p}" for p in PERCENTILES))]
    return (*keys, "max_itl_ms")


@dataclass(frozen=True)
class RunTotals:
    """Run-wide facts the records alone don't carry."""

    replicas: int
    sim_end: float  # simulated seconds at the end of the run
    peak_flops: float  # per replica
    peak_bandwidth: float  # per replica
    kv_total_blocks: int  # per replica
    kv_peak_blocks: int  # max over replicas
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    warmup_requests: int = 0
    cooldown_requests: int = 0


def ms_stats(values_s: np.ndarray) -> dict[str, float | None]:
    """``{mean, std, median, p90, p99}`` in ms of the non-NaN values (seconds); None when there are none."""
    v = values_s[~np.isnan(values_s)] * 1000.0
    out = {"mean": float(v.mean()) if len(v) else None, "std": float(v.std()) if len(v) else None}
    for p in PERCENTILES:
        out["median" if p == 50 else f"p{p}"] = float(np.percentile(v, p)) if len(v) else None
    return out


def closed_loop_throughput(clients: float, mean_e2el_s: float, mean_think_s: float) -> float:
    """Requests per second that ``clients`` closed-loop clients get in steady state: each cycles
    through a request (its end-to-end time) and a think time, so X = N / (R + Z) (the response-time
    law; Little's law over the cycle). Unlike ``request_throughput`` (the measured requests over
    first arrival to last completion, as vllm bench serve reports a run), it leaves out the ramp-up
    and the drain, which add about one end-to-end time to a short run's duration: what a capacity
    in req/s must not carry."""
    cycle = mean_e2el_s + mean_think_s
    return float(clients) / cycle if cycle > 0 else 0.0


def _stats(prefix: str, values_s: np.ndarray) -> dict[str, float | None]:
    """:func:`ms_stats` as summary keys: ``mean_<prefix>_ms``, ``std_...``, ``median_...``, ..."""
    return {f"{k}_{prefix}_ms": v for k, v in ms_stats(values_s).items()}


def ms_piece(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A ``(values, counts)`` piece of seconds as the summary's milliseconds."""
    return values * 1000.0, counts


def weighted_stats(prefix: str, pieces: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]],
                   first=None, rest: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]] | None = None,
                   ) -> dict[str, float | None]:
    """:func:`_stats` of values (seconds) repeated ``counts`` times, from ``(values, counts)``
    pieces (batchsim.sim.itl.weighted_summary: the percentiles equal np.percentile's exactly,
    the mean and std the weighted sums), without repeating them. ``first``, ``rest``: a first
    pass already made over the pieces before ``rest()``'s, in milliseconds
    (batchsim.sim.itl.ItlRecords.first_pass with :func:`ms_piece`)."""
    keys = ["median" if p == 50 else f"p{p}" for p in PERCENTILES]
    ms = lambda: (ms_piece(v, c) for v, c in pieces())  # noqa: E731
    try:
        _, mean, std, pct = weighted_summary(ms, PERCENTILES, first, rest)
    except EmptyError:
        return {f"mean_{prefix}_ms": None, f"std_{prefix}_ms": None, **{f"{k}_{prefix}_ms": None for k in keys}}
    out = {f"mean_{prefix}_ms": mean, f"std_{prefix}_ms": std}
    for k, val in zip(keys, pct):
        out[f"{k}_{prefix}_ms"] = float(val)
    return out


def measured_gaps(itl: ItlRecords, done) -> ItlRecords:
    """The inter-token gaps the ITL statistics are over: every gap of the completed requests in
    the measured window (``done``: request records, a batchsim.sim.table.Table or a pandas frame)."""
    rid = column(done, "rid", np.int64)
    keep = np.zeros(int(rid.max()) + 1 if len(rid) else 0, dtype=bool)
    keep[rid] = True
    return itl.select(keep)


def in_window(arrival: np.ndarray, warmup_s: float, cooldown_s: float, warmup_requests: int = 0,
              cooldown_requests: int = 0) -> np.ndarray:
    """Which arrivals are measured: in ``[warmup_s, last arrival - cooldown_s]``, less the first
    ``warmup_requests`` and the last ``cooldown_requests`` arrivals (in arrival order, ties by
    position): the one statement of the measured window (docs: DESIGN.md, metrics)."""
    if not len(arrival):
        return np.zeros(0, dtype=bool)
    hi = arrival.max() - cooldown_s
    keep = (arrival >= warmup_s) & (arrival <= hi)
    if warmup_requests or cooldown_requests:
        order = np.argsort(arrival, kind="stable")
        keep[order[:warmup_requests]] = False
        if cooldown_requests:
            keep[order[len(order) - min(cooldown_requests, len(order)):]] = False
    return keep


def _window(requests, totals: RunTotals):
    if not len(requests):
        return requests
    return requests[in_window(column(requests, "arrival"), totals.warmup_s, totals.cooldown_s,
                              totals.warmup_requests, totals.cooldown_requests)]


def _max(values: np.ndarray) -> float:
    """The largest value, NaN left out (NaN when none is left), as a frame's ``max()`` gives it."""
    v = values[~np.isnan(values)]
    return float(v.max()) if len(v) else math.nan


def _slo_ok(done, slo: dict[str, float] | None) -> np.ndarray:
    ok = np.ones(len(done), dtype=bool)
    for key, limit in (slo or {}).items():
        metric = key.removesuffix("_ms")
        col = "max_itl" if metric == "itl" else metric
        vals = column(done, col) * 1000.0
        ok &= np.nan_to_num(vals, nan=0.0) <= limit
    return ok


def summarize(requests, steps: StepTotals, itl: ItlRecords,
              totals: RunTotals, policy: str, slo: dict[str, float] | None = None) -> dict:
    """The run's summary dict (summary.json), deterministic key order, from its request records
    (a batchsim.sim.table.Table or a pandas frame)."""
    win = _window(requests, totals)
    status = column(win, "status")
    done = win[status == COMPLETED]
    start = float(column(win, "arrival", np.float64).min()) if len(win) else 0.0
    end = _max(column(done, "completion", np.float64)) if len(done) else start
    if (status == UNFINISHED).any():
        end = totals.sim_end
    duration = max(end - start, 1e-12)
    out_tok = int(column(done, "output_tokens").sum())
    in_tok = int(column(done, "prompt_tokens").sum())
    gaps = measured_gaps(itl, done)
    s: dict = {
        "policy": policy,
        "num_requests": int(len(requests)),
        "measured_requests": int(len(win)),
        "completed": int(len(done)),
        "rejected": int((status == REJECTED).sum()),
        "unfinished": int((status == UNFINISHED).sum()),
        "duration_s": duration,
        # (from the window's first arrival to its last: held against what a steady state needs)
        "arrival_span_s": float(column(win, "arrival", np.float64).max()) - start if len(win) else None,
        "total_input_tokens": in_tok,
        "total_output_tokens": out_tok,
        "request_throughput": len(done) / duration,
        "output_throughput": out_tok / duration,
        "total_token_throughput": (in_tok + out_tok) / duration,
        "request_goodput": float(_slo_ok(done, slo).sum()) / duration,
    }
    s.update(_stats("ttft", column(done, "ttft", float)))
    s.update(_stats("tpot", column(done, "tpot", float)))
    s.update(weighted_stats("itl", gaps.pieces, *gaps.first_pass(ms_piece)))
    s.update(_stats("e2el", column(done, "e2el", float)))
    # (null, like every ITL statistic, when no measured request has a gap: one-token outputs keep 0)
    max_itl = _max(column(done, "max_itl", np.float64)) * 1000.0 if s["mean_itl_ms"] is not None else math.nan
    s["max_itl_ms"] = max_itl if math.isfinite(max_itl) else None
    s["preemptions"] = int(column(requests, "preemptions").sum()) if len(requests) else 0
    s.update(_utilization(steps, totals))
    rejected = win[status == REJECTED]
    s["rejected_by_reason"] = rejections_by_kind(column(rejected, "reason").tolist()) if len(rejected) else {}
    s["warnings"] = _warnings(s, requests, totals)
    return s


def _warnings(s: dict, requests, totals: RunTotals) -> list[str]:
    """What a reader must know before trusting the summary's latencies, in words."""
    out: list[str] = []
    if not len(requests):
        return ["no requests arrived"]
    if not s["measured_requests"]:
        last, w, c = float(column(requests, "arrival", np.float64).max()), totals.warmup_s, totals.cooldown_s
        if w + c >= last:
            window = f"measure.warmup_s {w:g} s" + (f" + cooldown_s {c:g} s" if c else "")
            why = f"{window} >= the last arrival at {last:.4g} s"
        else:
            why = f"none arrived in [{w:g} s, {last - c:.4g} s]"
        out.append(f"no requests in the measured window ({why}): every latency is null")
    elif not s["completed"]:
        out.append(f"none of the {s['measured_requests']} requests in the measured window completed "
                   f"({s['rejected']} rejected, {s['unfinished']} unfinished): every latency is null")
    else:
        thin = thin_window(s["completed"])
        if thin:
            out.append(thin)
        if s["unfinished"]:
            out.append(f"{s['unfinished']} of {s['measured_requests']} measured requests unfinished at the "
                       "horizon: the latencies cover only the completed ones")
    share = steady_share(s["arrival_span_s"], s["median_e2el_ms"], s["p99_e2el_ms"]) if s["completed"] else None
    if share is not None and share < 1.0:
        out.append(f"the measured requests arrive within {share:.0%} of the span a steady state needs "
                   f"({SHORT_SPANS:g} median and {TAIL_SPANS:g} p99 E2E times, {s['arrival_span_s']:.4g} s of "
                   f"{s['arrival_span_s'] / share:.4g} s): a queue that grows, or the running batch of the "
                   "longest requests, may not have formed, so the latencies may be optimistic; run longer "
                   "(workload.num_requests, duration_s or the trace's window)")
    if s["rejected"]:
        kinds = ", ".join(f"{n} {k}" for k, n in s["rejected_by_reason"].items())
        out.append(f"{s['rejected']} of {s['measured_requests']} measured requests rejected ({kinds}): they "
                   f"never ran, so goodput counts them as failing and the latencies and throughputs describe "
                   f"only the {s['completed']} served")
    return out


def pool_utilization(steps: StepTotals, replicas: range, sim_end: float, peak_flops: float,
                     peak_bandwidth: float) -> dict:
    """The summary's utilization figures of some replicas alone (a disaggregated deployment's pool:
    ``peak_*`` per replica of it); its KV usage is the caller's."""
    totals = RunTotals(replicas=len(replicas), sim_end=sim_end, peak_flops=peak_flops,
                       peak_bandwidth=peak_bandwidth, kv_total_blocks=1, kv_peak_blocks=0)
    out = _utilization(steps, totals, replicas)
    del out["peak_kv_usage"]
    return out


def _utilization(steps: StepTotals, totals: RunTotals, replicas: range | None = None) -> dict:
    wall = max(totals.sim_end, 1e-12) * totals.replicas
    t = steps.totals(replicas)
    op_time, billed = t["op_time"], t["billed"]
    return {
        "busy_fraction": t["busy"] / wall,
        "mfu": t["useful_flops"] / (totals.peak_flops * wall),
        "mbu": t["bytes"] / (totals.peak_bandwidth * wall),
        "compute_bound_fraction": t["compute_s"] / op_time if op_time else 0.0,
        "token_efficiency": t["useful"] / billed if billed else 1.0,
        "mean_batch_size": t["mean_batch_size"],
        "num_steps": int(t["steps"]),
        "peak_kv_usage": totals.kv_peak_blocks / totals.kv_total_blocks,
        "out_of_range_ops": int(t["out_of_range"]),
    }
