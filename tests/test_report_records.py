"""batchsim.reports.derive on hand-built records: exact binned integrals, token split, load window.

Also the factories other report tests import (``hand_run``, ``hand_runs``):
records built by hand in the shape of ``batchsim.sim.records``, no simulation.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from batchsim.reports.derive import (latency_samples_ms, load_window, measured_completed, report_itl, timeline,
                                     token_split)
from batchsim.sim.itl import ItlRecords
from batchsim.reports.runs import PolicyRun
from batchsim.sim.records import REQUEST_COLUMNS, STEP_FIELDS

META = {"replicas": 1, "kv_blocks": 100, "peak_flops": 100.0, "peak_bandwidth": 1000.0}


def steps_frame(rows: list[dict]) -> pd.DataFrame:
    """Steps with every STEP_FIELDS column (0 unless given)."""
    return pd.DataFrame([{f: r.get(f, 0) for f, _ in STEP_FIELDS} for r in rows],
                        columns=[f for f, _ in STEP_FIELDS])


def requests_frame(rows: list[dict]) -> pd.DataFrame:
    """Requests with every REQUEST_COLUMNS column (NaN/0 unless given)."""
    base = {c: np.nan for c in REQUEST_COLUMNS}
    base.update(status="completed", reason="", replica=0, preemptions=0, cached_tokens=0)
    return pd.DataFrame([{**base, **r} for r in rows], columns=list(REQUEST_COLUMNS))


def hand_run(policy: str, slow: float = 1.0, seeds: int = 1) -> PolicyRun:
    """A small but complete run: 3 requests, 4 steps, a few ITL gaps."""
    req = requests_frame([
        dict(rid=0, arrival=0.0, admitted=0.0, first_token=0.1 * slow, completion=0.5 * slow,
             prompt_tokens=20, output_tokens=5, ttft=0.1 * slow, tpot=0.1 * slow, e2el=0.5 * slow),
        dict(rid=1, arrival=0.2, admitted=0.3, first_token=0.4 * slow, completion=0.9 * slow,
             prompt_tokens=40, output_tokens=3, ttft=0.4 * slow - 0.2, tpot=0.25 * slow, e2el=0.9 * slow - 0.2),
        dict(rid=2, arrival=0.5, admitted=0.6, first_token=0.8 * slow, completion=1.2 * slow,
             prompt_tokens=10, output_tokens=2, ttft=0.8 * slow - 0.5, tpot=0.4 * slow, e2el=1.2 * slow - 0.5),
    ])
    steps = steps_frame([
        dict(start=0.0, end=0.1 * slow, num_seqs=1, num_rows=1, prefill_tokens=20, flops=40.0, useful_flops=40.0,
             bytes=100.0, compute_s=0.08 * slow, memory_s=0.02 * slow, kv_used_blocks=2),
        dict(start=0.3, end=0.4 * slow, num_seqs=2, num_rows=2, prefill_tokens=40, decode_tokens=1,
             padding_tokens=4 if slow > 1 else 0, flops=80.0, useful_flops=80.0, bytes=150.0,
             compute_s=0.05 * slow, memory_s=0.05 * slow, kv_used_blocks=6),
        dict(start=0.6, end=0.8 * slow, num_seqs=3, num_rows=3, prefill_tokens=10, decode_tokens=2,
             flops=30.0, useful_flops=30.0, bytes=300.0, memory_s=0.2 * slow, kv_used_blocks=7),
        dict(start=0.9 * slow, end=1.2 * slow, num_seqs=2, num_rows=3, decode_tokens=2,
             padding_tokens=1 if slow > 1 else 0, flops=5.0, useful_flops=4.0, bytes=300.0,
             memory_s=0.3 * slow, kv_used_blocks=5),
    ])
    # (the report's gaps, batchsim.reports.derive.report_itl: value and count)
    itl = pd.DataFrame({"gap": np.array([1, 2.5, 4.0]) * 0.1 * slow, "count": [4, 2, 1]})
    base = {"policy": policy, "completed": 3, "median_ttft_ms": 100.0 * slow, "p99_ttft_ms": 300.0 * slow,
            "token_efficiency": 1.0 if slow == 1 else 0.9}
    summaries = tuple({**base, "median_ttft_ms": base["median_ttft_ms"] + i} for i in range(seeds))
    return PolicyRun(policy, req, steps, itl, summaries, dict(META))


def hand_runs(seeds: int = 1, names=("static", "continuous")) -> list[PolicyRun]:
    return [hand_run(p, slow=2.0 if i == 0 else 1.0, seeds=seeds) for i, p in enumerate(names)]


def test_timeline_exact_bins_with_a_step_across_two_bins():
    steps = steps_frame([
        dict(start=0.0, end=1.0, num_seqs=2, kv_used_blocks=10, useful_flops=100.0, bytes=1000.0,
             compute_s=0.25, memory_s=0.75),
        dict(start=1.0, end=3.0, num_seqs=4, kv_used_blocks=20, useful_flops=200.0, bytes=2000.0,
             compute_s=2.0, memory_s=0.0),
    ])
    req = requests_frame([dict(rid=0, arrival=0.0, admitted=0.0), dict(rid=1, arrival=0.5, admitted=1.0),
                          dict(rid=2, arrival=1.5, admitted=3.0)])
    tl = timeline(req, steps, META, t_end=4.0, bins=4)
    assert tl["t"].tolist() == [0.5, 1.5, 2.5, 3.5]
    assert tl["batch_size"].tolist()[:3] == [2.0, 4.0, 4.0] and math.isnan(tl["batch_size"][3])
    assert tl["kv_usage"].tolist()[:3] == pytest.approx([0.1, 0.2, 0.2])
    assert tl["mfu"].tolist() == pytest.approx([1.0, 1.0, 1.0, 0.0])
    assert tl["mbu"].tolist() == pytest.approx([1.0, 1.0, 1.0, 0.0])
    assert tl["compute_share"].tolist()[:3] == pytest.approx([0.25, 1.0, 1.0]) and math.isnan(tl["compute_share"][3])
    assert tl["queue_depth"].tolist() == pytest.approx([0.5, 0.5, 1.0, 0.0])


def test_timeline_sums_replicas_and_counts_zero_length_steps():
    steps = steps_frame([
        dict(replica=0, start=0.0, end=2.0, num_seqs=2, useful_flops=100.0, bytes=10.0, memory_s=1.0),
        dict(replica=1, start=1.0, end=2.0, num_seqs=6, useful_flops=100.0, bytes=10.0, memory_s=1.0),
        dict(replica=1, start=1.5, end=1.5, num_seqs=1, useful_flops=50.0),
    ])
    meta = dict(META, replicas=2)
    tl = timeline(requests_frame([]), steps, meta, t_end=2.0, bins=2)
    # bin 1: replica 0 half its step (50 FLOPs) + replica 1 whole step (100) + the point step (50).
    assert tl["mfu"].tolist() == pytest.approx([50 / 200, 200 / 200])
    assert tl["batch_size"].tolist() == pytest.approx([2.0, (2 * 1 + 6 * 1) / 2])
    assert tl["queue_depth"].tolist() == [0.0, 0.0]


def test_queue_rejected_leaves_at_once_never_admitted_waits_to_the_end():
    req = requests_frame([dict(rid=0, arrival=1.0, status="rejected"),
                          dict(rid=1, arrival=1.0, status="unfinished")])
    tl = timeline(req, steps_frame([]), META, t_end=2.0, bins=2)
    assert tl["queue_depth"].tolist() == [0.0, 1.0]


def test_token_split_prompt_padding_vs_dead_slots():
    steps = steps_frame([dict(prefill_tokens=10, padding_tokens=5), dict(decode_tokens=3, padding_tokens=2),
                         dict(prefill_tokens=4, decode_tokens=1)])
    assert token_split(steps) == {"prefill": 14.0, "decode": 4.0, "prompt_padding": 5.0, "dead_slots": 2.0}


def test_load_window_offered_and_served():
    # arrivals 0..4, window [1, 4] (3 s): requests 1-4 offer 4 x 10 tokens.
    req = requests_frame([dict(rid=i, arrival=float(i), output_tokens=10, first_token=i + 0.5) for i in range(5)])
    # replica 0 delivers token steps at 0.5, 1.0, 2.0, 3.9, 4.0, 4.5; replica 1 at 0.9, 3.0.
    # Runs (rid, replica, start, end, entry): rid 0's first token at step 0 and its tokens to step 5
    # (in the window: 1.0, 2.0, 3.9, 4.0); rid 1 from step 1 (after a gap) to 2 (1.0, 2.0); rid 2
    # on replica 1, its first token at 0.9 (not counted here: first tokens come from first_token)
    # and one at 3.0.
    itl = ItlRecords([np.array([0.5, 1.0, 2.0, 3.9, 4.0, 4.5]), np.array([0.9, 3.0])],
                     [0, 1, 2], [0, 0, 1], [0, 1, 0], [5, 2, 1], [np.nan, 0.5, np.nan])
    w = load_window(req, itl)
    assert w["offered_output_throughput"] == pytest.approx(40 / 3)
    # first tokens at 1.5, 2.5, 3.5 + later tokens 4 + 2 + 1
    assert w["served_output_throughput"] == pytest.approx((3 + 7) / 3)


def test_measured_window_and_latency_samples():
    run = hand_run("x")
    req = run.requests.copy()
    assert len(measured_completed(req, warmup_s=0.1)) == 2
    # the run's gaps as the engines record them: one replica per request, a run each
    rec = ItlRecords([np.array([0.1, 0.2, 0.3, 0.4, 0.5]), np.array([0.4, 0.65, 0.9]), np.array([0.8, 1.2])],
                     [0, 1, 2], [0, 1, 2], [0, 0, 0], [4, 2, 1], [np.nan] * 3)
    itl = report_itl(req, rec, {"warmup_s": 0.1})  # (request 0 arrived before the window)
    s = latency_samples_ms(req, itl, {"warmup_s": 0.1})
    assert sorted(s["ttft"].round(6)) == [200.0, 300.0]
    assert np.repeat(s["itl"], s["itl_counts"]).round(6).tolist() == [250.0, 250.0, 400.0]
