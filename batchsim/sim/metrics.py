"""Summary metrics from records, with ``vllm bench serve``'s key names.

Latency percentiles are over the requests in the measured window (arrival in
``[warmup_s, last_arrival - cooldown_s]``); ITL percentiles over every gap
of those requests. Utilization is over the whole simulated time of all
replicas. See DESIGN.md "Semantics everyone must agree on".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from batchsim.sim.state import COMPLETED, REJECTED, UNFINISHED

__all__ = ["RunTotals", "summarize", "PERCENTILES", "LATENCY_METRICS"]

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


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


def _stats(prefix: str, values_s: np.ndarray) -> dict[str, float]:
    v = values_s[~np.isnan(values_s)] * 1000.0
    out = {f"mean_{prefix}_ms": float(v.mean()) if len(v) else 0.0,
           f"std_{prefix}_ms": float(v.std()) if len(v) else 0.0}
    for p in PERCENTILES:
        key = "median" if p == 50 else f"p{p}"
        out[f"{key}_{prefix}_ms"] = float(np.percentile(v, p)) if len(v) else 0.0
    return out


def in_window(arrival: np.ndarray, warmup_s: float, cooldown_s: float) -> np.ndarray:
    """Which arrivals are measured: in ``[warmup_s, last arrival - cooldown_s]``."""
    if not len(arrival):
        return np.zeros(0, dtype=bool)
    hi = arrival.max() - cooldown_s
    return (arrival >= warmup_s) & (arrival <= hi)


def _window(requests: pd.DataFrame, totals: RunTotals) -> pd.DataFrame:
    if requests.empty:
        return requests
    return requests[in_window(requests["arrival"].to_numpy(), totals.warmup_s, totals.cooldown_s)]


def _slo_ok(done: pd.DataFrame, slo: dict[str, float] | None) -> np.ndarray:
    ok = np.ones(len(done), dtype=bool)
    for key, limit in (slo or {}).items():
        metric = key.removesuffix("_ms")
        col = "max_itl" if metric == "itl" else metric
        vals = done[col].to_numpy() * 1000.0
        ok &= np.nan_to_num(vals, nan=0.0) <= limit
    return ok


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, itl: pd.DataFrame,
              totals: RunTotals, policy: str, slo: dict[str, float] | None = None) -> dict:
    """The run's summary dict (summary.json), deterministic key order."""
    win = _window(requests, totals)
    done = win[win["status"] == COMPLETED]
    start = float(win["arrival"].min()) if len(win) else 0.0
    end = float(done["completion"].max()) if len(done) else start
    if (win["status"] == UNFINISHED).any():
        end = totals.sim_end
    duration = max(end - start, 1e-12)
    out_tok = int(done["output_tokens"].sum())
    in_tok = int(done["prompt_tokens"].sum())
    aggregate = not isinstance(itl, pd.DataFrame)  # an ItlAggregate (measure.records: aggregate)
    gaps = (np.empty(0) if aggregate or not len(itl)
            else itl[itl["rid"].isin(done["rid"])]["gap"].to_numpy())
    s: dict = {
        "policy": policy,
        "num_requests": int(len(requests)),
        "measured_requests": int(len(win)),
        "completed": int(len(done)),
        "rejected": int((win["status"] == REJECTED).sum()),
        "unfinished": int((win["status"] == UNFINISHED).sum()),
        "duration_s": duration,
        "total_input_tokens": in_tok,
        "total_output_tokens": out_tok,
        "request_throughput": len(done) / duration,
        "output_throughput": out_tok / duration,
        "total_token_throughput": (in_tok + out_tok) / duration,
        "request_goodput": float(_slo_ok(done, slo).sum()) / duration,
    }
    for name, vals in (("ttft", done["ttft"].to_numpy()), ("tpot", done["tpot"].to_numpy()),
                       ("itl", gaps), ("e2el", done["e2el"].to_numpy())):
        if name == "itl" and aggregate:
            s.update(itl.stats(name, PERCENTILES))
            continue
        s.update(_stats(name, np.asarray(vals, dtype=float)))
    s["max_itl_ms"] = float(done["max_itl"].max() * 1000.0) if len(done) else 0.0
    s["preemptions"] = int(requests["preemptions"].sum()) if len(requests) else 0
    s.update(_utilization(steps, totals))
    return s


def step_sums(steps: pd.DataFrame) -> dict:
    """The sums of the step records that utilization is made of (what
    :meth:`batchsim.sim.aggregate.StepTotals.totals` keeps without the records)."""
    n = len(steps)
    return {
        "busy": float((steps["end"] - steps["start"]).sum()) if n else 0.0,
        "billed": float(steps[["prefill_tokens", "decode_tokens", "padding_tokens"]].to_numpy().sum()),
        "useful": float(steps[["prefill_tokens", "decode_tokens"]].to_numpy().sum()),
        "op_time": float(steps[["compute_s", "memory_s"]].to_numpy().sum()),
        "useful_flops": float(steps["useful_flops"].sum()),
        "bytes": float(steps["bytes"].sum()),
        "compute_s": float(steps["compute_s"].sum()),
        "mean_batch_size": float(steps["num_seqs"].mean()) if n else 0.0,
        "steps": n,
        "out_of_range": int(steps["out_of_range"].sum()) if n else 0,
    }


def _utilization(steps, totals: RunTotals) -> dict:
    wall = max(totals.sim_end, 1e-12) * totals.replicas
    # a StepTotals (measure.records: aggregate) keeps the same sums without the records
    t = step_sums(steps) if isinstance(steps, pd.DataFrame) else steps.totals()
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
