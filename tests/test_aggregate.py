"""Aggregate records (measure.records: aggregate): no step rows kept, the same summary.

Every run's summary reads the step totals and the gap records (batchsim.sim.itl), kept
or not, so an aggregate run's summary equals the full-record run's exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from batchsim.sim.aggregate import STEP_CHUNK, StepTotals
from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_parts, simulate, write_outputs

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
        assert agg[key] == want, key


def test_aggregate_run_keeps_no_per_step_records_and_writes_no_steps_csv(tmp_path):
    r = _run(_raw("continuous", "aggregate", horizon_s=20.0))
    assert len(r.steps) == 0 and len(r.itl) > 0
    assert r.summary["num_steps"] > 1000 and r.summary["unfinished"] >= 0
    write_outputs(r, tmp_path / "agg")
    assert sorted(p.name for p in (tmp_path / "agg").iterdir()) == ["manifest.json", "requests.csv", "summary.json"]


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


def test_a_block_of_other_dtypes_sums_as_if_written_into_the_chunks():
    """Whole chunks of a block are reduced where they lie only when that sums the same values
    alike: float32 columns are cast into the chunk first (as before), integers of any size are not."""
    rng = np.random.default_rng(0)
    n = 2 * STEP_CHUNK + 5
    start = np.cumsum(rng.random(n)).astype(np.float32)
    end = start + rng.random(n).astype(np.float32)
    f32 = [rng.random(n).astype(np.float32) for _ in range(7)]
    ints = [rng.integers(0, 9, n).astype(np.int32) for _ in range(10)]
    got, want = StepTotals(1), StepTotals(1)
    got.extend(np.zeros(n, dtype=np.int32), start, end, *ints[:5], *f32, ints[5], ints[6], ints[7], ints[8], ints[9])
    want.extend(np.zeros(n, dtype=np.int64), start.astype(np.float64), end.astype(np.float64),
                *(a.astype(np.int64) for a in ints[:5]), *(a.astype(np.float64) for a in f32),
                *(a.astype(np.int64) for a in ints[5:]))
    assert got.totals() == want.totals()


def test_many_whole_chunks_of_a_block_sum_as_rows_written_one_at_a_time():
    """A block spanning several whole chunks is reduced a chunk per row of one view; its float
    totals equal those of the same rows appended one by one (each chunk then reduced alone),
    bit for bit, wherever the block starts in a chunk."""
    rng = np.random.default_rng(3)
    for lead in (0, 1, STEP_CHUNK - 1):
        n = lead + 5 * STEP_CHUNK + 7
        start = np.cumsum(rng.lognormal(size=n))
        end = start + rng.lognormal(-3, 2, n)
        fl = [rng.lognormal(0, 3, n) * 1e9 for _ in range(7)]
        ints = [rng.integers(0, 1 << 20, n) for _ in range(10)]
        cols = [np.zeros(n, dtype=np.int64), start, end, *ints[:5], *fl, *ints[5:]]
        block, rows = StepTotals(1), StepTotals(1)
        block.extend(*(c[:lead] for c in cols), count=lead)
        block.extend(*(c[lead:] for c in cols), count=n - lead)
        for r in zip(*(c.tolist() for c in cols)):
            rows.append(*r)
        assert block.totals() == rows.totals()
