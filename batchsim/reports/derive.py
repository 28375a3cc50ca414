"""Series derived from records: latency samples, binned timelines, token split, load.

Everything here is a pure function of the record frames of ``batchsim.sim.records``
(requests, steps, ITL gaps) and a few run facts, so it is tested with
hand-built frames. Time-binned quantities are exact integrals: a step's work
is spread uniformly over its ``[start, end)``, so a long prefill that spans
several bins adds to each the part that fell in it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["measured_completed", "report_itl", "latency_samples_ms", "timeline", "token_split",
           "load_window", "TIMELINE_FIELDS"]

TIMELINE_FIELDS = ("t", "batch_size", "kv_usage", "queue_depth", "mfu", "mbu", "compute_share")


def measured_completed(requests, warmup_s: float = 0.0, cooldown_s: float = 0.0,
                       warmup_requests: int = 0, cooldown_requests: int = 0):
    """Completed requests in the measured window (batchsim.sim.metrics.in_window, as the summary
    counts them), of request records: a pandas frame or a batchsim.sim.table.Table, returned as given."""
    from batchsim.sim.metrics import in_window
    from batchsim.sim.table import column

    if not len(requests):
        return requests
    win = requests[in_window(column(requests, "arrival", np.float64), warmup_s, cooldown_s,
                             warmup_requests, cooldown_requests)]
    return win[column(win, "status") == "completed"]


def _window_of(meta: dict) -> tuple:
    return (meta.get("warmup_s", 0.0), meta.get("cooldown_s", 0.0), int(meta.get("warmup_requests", 0) or 0),
            int(meta.get("cooldown_requests", 0) or 0))


def report_itl(requests: pd.DataFrame, itl, meta: dict) -> pd.DataFrame:
    """The gaps of the measured completed requests (as the summary counts them) as a frame of
    ``gap`` (s) and ``count``: what compare's report keeps of a run's batchsim.sim.itl.ItlRecords."""
    from batchsim.sim.metrics import measured_gaps

    done = measured_completed(requests, *_window_of(meta))
    return measured_gaps(itl, done).weighted_frame()


def latency_samples_ms(requests: pd.DataFrame, itl: pd.DataFrame, meta: dict) -> dict[str, np.ndarray]:
    """TTFT, TPOT, E2E per measured request, in ms; ``itl`` the report's gaps (:func:`report_itl`)
    in ms with their counts in ``itl_counts``."""
    done = measured_completed(requests, *_window_of(meta))
    out = {}
    for key in ("ttft", "tpot", "e2el"):
        v = done[key].to_numpy(dtype=float) if len(done) else np.empty(0)
        out[key] = v[~np.isnan(v)] * 1000.0
    out["itl"] = itl["gap"].to_numpy(dtype=float) * 1000.0 if len(itl) else np.empty(0)
    out["itl_counts"] = itl["count"].to_numpy(dtype=np.int64) if len(itl) else np.empty(0, dtype=np.int64)
    return out


def _ramp_sum(x: np.ndarray, w: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``sum_i w_i * max(0, t - x_i)`` at every ``t``."""
    order = np.argsort(x, kind="stable")
    xs, ws = x[order], w[order]
    cw = np.concatenate(([0.0], np.cumsum(ws)))
    cwx = np.concatenate(([0.0], np.cumsum(ws * xs)))
    k = np.searchsorted(xs, t, side="right")
    return t * cw[k] - cwx[k]


def _step_integrals(steps: pd.DataFrame, amounts: dict[str, np.ndarray], edges: np.ndarray) -> dict[str, np.ndarray]:
    """Each amount summed per time bin, every step's share spread over its duration.

    Per replica, steps never overlap, so the running total of an amount is a
    piecewise-linear function of time through ``(start_i, total before i)``
    and ``(end_i, total after i)``; ``np.interp`` evaluates it at the bin
    edges exactly (no cancellation) and a zero-length step is a jump.
    """
    out = {k: np.zeros(len(edges) - 1) for k in amounts}
    if steps.empty:
        return out
    start = steps["start"].to_numpy(dtype=float)
    end = np.maximum(steps["end"].to_numpy(dtype=float), start)
    replica = steps["replica"].to_numpy() if "replica" in steps else np.zeros(len(steps), dtype=int)
    for r in np.unique(replica):
        idx = np.flatnonzero(replica == r)
        idx = idx[np.argsort(start[idx], kind="stable")]
        xp = np.empty(2 * len(idx))
        xp[0::2], xp[1::2] = start[idx], end[idx]
        xp = np.maximum.accumulate(xp)  # NOTE: guards np.interp against a malformed overlap
        fp = np.empty_like(xp)
        for k, a in amounts.items():
            a = np.asarray(a, dtype=float)[idx]
            total = np.cumsum(a)
            fp[0::2], fp[1::2] = total - a, total
            out[k] += np.diff(np.interp(edges, xp, fp))
    return out


def _queue_time(requests: pd.DataFrame, edges: np.ndarray) -> np.ndarray:
    """Request-seconds spent waiting (arrived, not yet admitted) in each bin."""
    if requests.empty:
        return np.zeros(len(edges) - 1)
    arr = requests["arrival"].to_numpy(dtype=float)
    adm = requests["admitted"].to_numpy(dtype=float)
    # NOTE: a rejected request leaves the queue at once, a never-admitted one
    # waits to the end; a preempted request back in the queue is not counted
    # (the request records keep only the first admission).
    left = np.where(np.isnan(adm), np.where(requests["status"].to_numpy() == "rejected", arr, edges[-1]), adm)
    ones = np.ones(len(arr))
    return np.diff(_ramp_sum(arr, ones, edges) - _ramp_sum(np.maximum(left, arr), ones, edges))


def timeline(requests: pd.DataFrame, steps: pd.DataFrame, meta: dict, t_end: float,
             bins: int = 200) -> pd.DataFrame:
    """Per time bin: mean batch size and KV usage while busy, waiting requests,
    MFU, MBU and the compute-bound share of operator time (columns
    :data:`TIMELINE_FIELDS`). Batch size, KV usage and compute share are NaN
    in a bin with no step (a gap in the line); MFU and MBU are 0 there."""
    edges = np.linspace(0.0, max(t_end, 1e-9), bins + 1)
    width = edges[1] - edges[0]
    d = (steps["end"] - steps["start"]).to_numpy(dtype=float)
    col = {k: steps[k].to_numpy(dtype=float) for k in
           ("num_seqs", "kv_used_blocks", "useful_flops", "bytes", "compute_s", "memory_s")}
    b = _step_integrals(steps, {"busy": d, "seqs": col["num_seqs"] * d, "kv": col["kv_used_blocks"] * d,
                                "flops": col["useful_flops"], "bytes": col["bytes"],
                                "comp": col["compute_s"], "mem": col["memory_s"]}, edges)
    reps = float(meta.get("replicas", 1))
    op = b["comp"] + b["mem"]
    with np.errstate(divide="ignore", invalid="ignore"):
        on = np.where(b["busy"] > 0, b["busy"], np.nan)
        return pd.DataFrame({
            "t": (edges[:-1] + edges[1:]) / 2,
            "batch_size": b["seqs"] / on,
            "kv_usage": b["kv"] / on / float(meta.get("kv_blocks", 1)),
            "queue_depth": _queue_time(requests, edges) / width,
            "mfu": b["flops"] / (meta["peak_flops"] * reps * width),
            "mbu": b["bytes"] / (meta["peak_bandwidth"] * reps * width),
            "compute_share": np.where(op > 0, b["comp"] / op, np.nan),
        })


def token_split(steps: pd.DataFrame) -> dict[str, float]:
    """Billed tokens by kind: useful prefill and decode, prompt padding, dead slots.

    Padding billed in a step that also prefills is prompt padding (a static
    batch padded to its longest prompt); padding in a decode-only step is a
    dead slot (a finished sequence still riding along until its batch ends).
    """
    pad = steps["padding_tokens"].to_numpy(dtype=float)
    prefill = steps["prefill_tokens"].to_numpy(dtype=float)
    in_prefill = prefill > 0
    return {
        "prefill": float(prefill.sum()),
        "decode": float(steps["decode_tokens"].to_numpy(dtype=float).sum()),
        "prompt_padding": float(pad[in_prefill].sum()),
        "dead_slots": float(pad[~in_prefill].sum()),
    }


def load_window(requests: pd.DataFrame, itl, skip: float = 0.25) -> dict[str, float]:
    """Offered and served output tokens/s while requests are still arriving.

    The window is ``[a0 + skip*(a1 - a0), a1]`` (``a0``/``a1`` the first and
    last arrival). Offered: output tokens of the requests arriving in it per
    second. Served: output tokens the clients got in it per second: first
    tokens stamped in it plus every later token delivered in it, read from the
    run's gap records (``itl``, a batchsim.sim.itl.ItlRecords: kept whatever
    ``measure.records`` and ``--steps`` keep, so the figure is the same either
    way). Skipping the start lets the tokens in flight at both ends cancel; the
    drain after the last arrival, which a short run's whole-run throughput
    counts, is left out.
    """
    # NOTE: not the step records' decode_tokens: aggregate records keep none (every sweep point read
    # as saturated), and a row of one token over a context (a prompt's last one-token chunk, a full
    # prefix-cache hit, a decode replica's recompute) is billed as a decode but samples a first token.
    if len(requests) < 2:
        return {"offered_output_throughput": 0.0, "served_output_throughput": 0.0, "load_window_s": 0.0}
    a = requests["arrival"].to_numpy(dtype=float)
    a0, a1 = float(a.min()), float(a.max())
    lo = a0 + skip * (a1 - a0)
    span = max(a1 - lo, 1e-12)
    offered = float(requests.loc[(a >= lo) & (a <= a1), "output_tokens"].sum())
    ft = requests["first_token"].to_numpy(dtype=float)
    firsts = int(((ft >= lo) & (ft <= a1)).sum())
    return {"offered_output_throughput": offered / span,
            "served_output_throughput": (firsts + _later_tokens(itl, lo, a1)) / span, "load_window_s": span}


def _later_tokens(itl, lo: float, hi: float) -> int:
    """How many tokens after requests' first ones were delivered in ``[lo, hi]``: a run's tokens are its
    replica's token steps ``start..end`` (a run that begins with a first token, ``entry`` NaN, from
    ``start + 1``), and a replica's delivery times never decrease, so those in the window are the token
    steps ``[count < lo, count <= hi)``."""
    if not len(itl.rid):
        return 0
    below = np.array([t.count_at_most(np.nextafter(lo, -np.inf)) for t in itl.times], dtype=np.int64)
    upto = np.array([t.count_at_most(hi) for t in itl.times], dtype=np.int64)
    first = itl.start + np.isnan(itl.entry)
    k0 = np.maximum(first, below[itl.replica])
    k1 = np.minimum(itl.end + 1, upto[itl.replica])
    return int(np.maximum(k1 - k0, 0).sum())
