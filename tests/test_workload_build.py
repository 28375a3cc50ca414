"""build_workload: the Workload it returns, its seeding, empirical arrivals and speed."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsim.sim.types import Workload
from batchsim.workloads import WorkloadConfig, build_workload

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"


def build(seed: int = 0, base: Path | None = None, **data) -> Workload:
    return build_workload(WorkloadConfig.model_validate(data), np.random.default_rng(seed), base)


def test_synthetic_workload_shape_and_types():
    w = build(num_requests=1000, arrival={"process": "gamma", "rate": 4, "cv": 2},
              prompt_tokens={"dist": "uniform", "min": 10, "max": 20}, output_tokens={"dist": "fixed", "value": 3})
    assert isinstance(w, Workload) and len(w) == 1000
    assert w.arrival.dtype == np.float64 and w.prompt_tokens.dtype == np.int64 and w.output_tokens.dtype == np.int64
    assert w.arrival[0] == 0.0 and np.all(np.diff(w.arrival) >= 0)
    assert w.prompt_tokens.min() >= 10 and w.prompt_tokens.max() <= 20 and np.all(w.output_tokens == 3)
    assert w.prefix_hashes is None and w.prefix_block_tokens == 0


def test_same_seed_same_workload_other_seed_differs():
    spec = {"num_requests": 500, "arrival": {"process": "poisson", "rate": 2}}
    a, b, c = build(7, **spec), build(7, **spec), build(8, **spec)
    for col in ("arrival", "prompt_tokens", "output_tokens"):
        assert np.array_equal(getattr(a, col), getattr(b, col))
    assert not np.array_equal(a.arrival, c.arrival)


def test_changing_the_load_keeps_the_same_requests():
    # Arrivals and lengths draw from separate streams: a load sweep compares identical requests.
    lo = build(3, num_requests=200, arrival={"process": "poisson", "rate": 1}, output_tokens={"dist": "uniform", "min": 1, "max": 99})
    hi = build(3, num_requests=200, arrival={"process": "gamma", "rate": 9, "cv": 3}, output_tokens={"dist": "uniform", "min": 1, "max": 99})
    assert np.array_equal(lo.prompt_tokens, hi.prompt_tokens)
    assert np.array_equal(lo.output_tokens, hi.output_tokens)
    assert not np.array_equal(lo.arrival, hi.arrival)


def test_zero_rate_builds_an_empty_workload():
    w = build(num_requests=100, arrival={"process": "poisson", "rate": 0})
    assert len(w) == 0
    assert w.arrival.dtype == np.float64 and w.prompt_tokens.dtype == np.int64 and w.output_tokens.dtype == np.int64
    assert len(build(duration_s=0, arrival={"process": "poisson", "rate": 5})) == 0


def test_duration_only_and_both_limits():
    w = build(duration_s=100.0, arrival={"process": "constant", "rate": 2})
    assert len(w) == 200 and w.arrival[-1] == 99.5
    assert len(build(num_requests=10, duration_s=100.0, arrival={"process": "constant", "rate": 2})) == 10


def test_empirical_arrival_resamples_the_trace_gaps():
    trace = {"format": "csv", "path": "generic_ms.csv", "time_unit": "ms",
             "columns": {"arrival": "t_ms", "prompt_tokens": "in", "output_tokens": "out"}}
    w = build(num_requests=3000, base=FIXTURES, arrival={"process": "empirical", "trace": trace})
    gaps = np.diff(w.arrival)
    assert set(np.round(gaps, 9).tolist()) <= {0.25, 0.0, 0.75}
    assert np.mean(gaps) == pytest.approx(1 / 3, rel=0.05)
    w = build(num_requests=3000, base=FIXTURES, arrival={"process": "empirical", "trace": trace, "rate": 30.0})
    assert (len(w) - 1) / w.arrival[-1] == pytest.approx(30.0, rel=0.05)
    assert len(build(num_requests=10, base=FIXTURES, arrival={"process": "empirical", "trace": trace, "rate": 0})) == 0


def test_empirical_lengths_resolve_against_the_scenario_folder():
    w = build(num_requests=50, base=FIXTURES,
              prompt_tokens={"dist": "empirical", "path": "lengths_small.csv", "column": "num_prefill_tokens"})
    assert set(w.prompt_tokens.tolist()) <= {74, 290, 1000}


def test_trace_capped_by_num_requests():
    w = build(base=FIXTURES, num_requests=2, trace={"format": "mooncake", "path": "mooncake_small.jsonl"})
    assert len(w) == 2 and w.prefix_hashes == ((0, 1, 2), (0, 3))


def test_million_synthetic_requests_well_under_two_seconds():
    cfg = WorkloadConfig.model_validate({
        "num_requests": 1_000_000, "arrival": {"process": "gamma", "rate": 50, "cv": 2},
        "prompt_tokens": {"dist": "lognormal", "median": 512, "p90": 2048, "max": 8192},
        "output_tokens": {"dist": "uniform", "min": 1, "max": 512}})
    start = time.perf_counter()
    w = build_workload(cfg, np.random.default_rng(0))
    elapsed = time.perf_counter() - start
    assert len(w) == 1_000_000
    assert elapsed < 2.0, f"{elapsed:.2f} s"


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 200), rate=st.one_of(st.just(0.0), st.floats(1e-3, 100.0)), median=st.integers(1, 4000), seed=st.integers(0, 2**32 - 1))
def test_built_workloads_are_valid_and_reproducible(n, rate, median, seed):
    spec = {"num_requests": n, "arrival": {"process": "poisson", "rate": rate},
            "prompt_tokens": {"dist": "lognormal", "median": median, "p90": median * 3, "max": 8192}}
    w = build(seed, **spec)
    assert len(w) == (n if rate > 0 else 0)
    assert np.all(np.diff(w.arrival) >= 0) and (len(w) == 0 or w.arrival[0] == 0.0)
    assert np.all(w.prompt_tokens >= 1) and np.all(w.prompt_tokens <= 8192) and np.all(w.output_tokens >= 1)
    again = build(seed, **spec)
    assert np.array_equal(w.arrival, again.arrival) and np.array_equal(w.prompt_tokens, again.prompt_tokens)
