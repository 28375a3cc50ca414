"""Aggregate records (measure.records: aggregate): bounded memory, same summary.

The summary of an aggregate run must match the full-record run: exactly for
every per-request figure, to float rounding for the utilization sums, and to
the histogram's resolution (0.1% bins) for ITL percentiles.
"""

from __future__ import annotations

import numpy as np
import pytest

from batchsim.sim.aggregate import STEP_CHUNK, ItlAggregate, StepTotals
from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_parts, simulate, write_outputs

ITL_PCT = {"median_itl_ms", "p90_itl_ms", "p99_itl_ms"}


def _raw(policy: str, records: str, **kw) -> dict:
    raw = {
        "model": "llama-3-8b", "hardware": "h100-sxm", "replicas": 2, "router": "least_outstanding",
        "policy": {"name": policy}, "seed": 5,
        "workload": {"num_requests": 400, "arrival": {"process": "poisson", "rate": 8.0},
                     "prompt_tokens": {"dist": "lognormal", "median": 500, "p90": 2000, "max": 4000},
                     "output_tokens": {"dist": "lognormal", "median": 120, "p90": 400, "max": 800}},
        "measure": {"records": records, "warmup_s": 2.0, "cooldown_s": 2.0},
    }
    raw.update(kw)
    return raw


def _run(raw: dict):
    sc = scenario_from_dict(raw)
    return simulate(sc, build_parts(sc))


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked_prefill"])
def test_aggregate_summary_matches_full_records(policy):
    full = _run(_raw(policy, "full")).summary
    agg = _run(_raw(policy, "aggregate")).summary
    assert list(full) == list(agg)
    for key, want in full.items():
        if key == "provenance":  # (says which records were kept: differs by design)
            continue
        got = agg[key]
        if key in ITL_PCT:
            assert got == pytest.approx(want, rel=1e-3), key
        elif isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-12, abs=1e-15), key
        else:
            assert got == want, key


def test_aggregate_run_keeps_no_per_step_records_and_writes_no_steps_csv(tmp_path):
    r = _run(_raw("continuous", "aggregate", horizon_s=20.0))
    assert len(r.steps) == 0 and len(r.itl) == 0
    assert r.summary["num_steps"] > 1000 and r.summary["unfinished"] >= 0
    out = write_outputs(r, tmp_path / "agg")
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "requests.csv", "summary.json"]


def test_step_totals_hold_at_most_one_chunk_per_replica():
    t = StepTotals(2)
    n = 3 * STEP_CHUNK + 17
    ones = np.ones(n)
    t.extend(0, np.arange(n, dtype=float), np.arange(n, dtype=float) + 0.5, 1, 1, 0, 1, 0,
             ones, ones, ones, ones, ones, 0.0, 0.0, 0, 5, 0, 1, 0, count=n)
    t.append(1, 0.0, 2.0, 4, 4, 3, 1, 0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0, 5, 0, 1, 0)
    assert all(len(b) < STEP_CHUNK for b in t._bufs)  # full chunks were reduced
    tot = t.totals()
    assert tot["steps"] == n + 1 and tot["busy"] == 0.5 * n + 2.0 and tot["decode_tokens"] == n + 1
    assert tot["prefill_tokens"] == 3 and tot["max_end"] == n - 0.5


def test_itl_histogram_percentiles_within_a_tenth_of_a_percent():
    rng = np.random.default_rng(1)
    gaps = rng.lognormal(np.log(0.02), 1.0, 200_000)
    rids = rng.integers(0, 100, len(gaps))
    measured = np.arange(100) % 3 != 0
    agg = ItlAggregate(1, measured)
    sink = agg.sink(0)
    for lo in range(0, len(gaps), 7_777):  # uneven blocks, split at chunk boundaries
        sink.extend(rids[lo:lo + 7_777], gaps[lo:lo + 7_777])
    want = gaps[measured[rids]] * 1000.0
    got = agg.stats("itl", (50, 90, 99))
    assert got["mean_itl_ms"] == pytest.approx(want.mean(), rel=1e-12)
    assert got["std_itl_ms"] == pytest.approx(want.std(), rel=1e-9)
    for p, key in ((50, "median_itl_ms"), (90, "p90_itl_ms"), (99, "p99_itl_ms")):
        assert got[key] == pytest.approx(np.percentile(want, p), rel=1e-3)
