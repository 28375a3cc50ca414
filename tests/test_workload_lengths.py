"""Length distributions: exact values, lognormal quantiles on 100k draws, and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from batchsim.workloads import lengths
from batchsim.workloads.config import LengthConfig

LENGTH = TypeAdapter(LengthConfig)


def draw(spec: dict, n: int, seed: int = 0, base=None) -> np.ndarray:
    return lengths.sample(LENGTH.validate_python(spec), n, np.random.default_rng(seed), base)


def test_fixed_and_uniform():
    assert draw({"dist": "fixed", "value": 7}, 3).tolist() == [7, 7, 7]
    u = draw({"dist": "uniform", "min": 3, "max": 5}, 10_000)
    assert set(u.tolist()) == {3, 4, 5}
    assert draw({"dist": "uniform", "min": 4, "max": 4}, 3).tolist() == [4, 4, 4]


def test_lognormal_median_and_p90_on_100k():
    x = draw({"dist": "lognormal", "median": 512, "p90": 2048}, 100_000, seed=1)
    assert np.median(x) == pytest.approx(512, rel=0.02)
    assert np.quantile(x, 0.9) == pytest.approx(2048, rel=0.02)


def test_lognormal_clips_to_min_and_max():
    x = draw({"dist": "lognormal", "median": 512, "p90": 2048, "min": 64, "max": 4096}, 100_000, seed=2)
    assert x.min() == 64 and x.max() == 4096
    tail = 0.5 * math.erfc(np.log(8) / lengths.lognormal_sigma(512, 2048) / math.sqrt(2))  # P(draw > 8 x median)
    assert np.mean(x == 4096) == pytest.approx(tail, abs=0.002)
    assert np.median(x) == pytest.approx(512, rel=0.02)


def test_lognormal_with_p90_equal_median_is_fixed():
    assert draw({"dist": "lognormal", "median": 100, "p90": 100}, 5).tolist() == [100] * 5


def test_empirical_draws_values_of_the_column(tmp_path):
    (tmp_path / "l.csv").write_text("a,b\n10,0\n20,3\n30,3\n")
    x = draw({"dist": "empirical", "path": "l.csv", "column": "a"}, 10_000, base=tmp_path)
    assert set(x.tolist()) == {10, 20, 30}
    assert np.mean(x == 20) == pytest.approx(1 / 3, abs=0.02)
    y = draw({"dist": "empirical", "path": "l.csv", "column": "b"}, 1000, base=tmp_path)
    assert set(y.tolist()) == {1, 3}  # 0 is raised to 1
    (tmp_path / "l.jsonl").write_text('{"n": 5}\n{"n": 6}\n')
    z = draw({"dist": "empirical", "path": "l.jsonl", "column": "n"}, 100, base=tmp_path)
    assert set(z.tolist()) == {5, 6}


lengths_st = st.one_of(
    st.builds(lambda v: {"dist": "fixed", "value": v}, st.integers(1, 10**6)),
    st.builds(lambda a, b: {"dist": "uniform", "min": min(a, b), "max": max(a, b)}, st.integers(1, 10**6), st.integers(1, 10**6)),
    st.builds(lambda m, r, lo, span: {"dist": "lognormal", "median": m, "p90": m * r, "min": lo, "max": lo + span},
              st.floats(1.0, 1e5), st.floats(1.0, 50.0), st.integers(1, 1000), st.integers(0, 10**5)),
    st.builds(lambda m, r: {"dist": "lognormal", "median": m, "p90": m * r}, st.floats(0.01, 1e5), st.floats(1.0, 20.0)),
)


@settings(max_examples=100, deadline=None)
@given(spec=lengths_st, n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_lengths_are_int64_within_bounds_and_deterministic(spec, n, seed):
    x = draw(spec, n, seed)
    assert x.dtype == np.int64 and len(x) == n
    assert np.all(x >= max(1, spec.get("min", 1)))
    if "max" in spec:
        assert np.all(x <= spec["max"])
    if spec["dist"] == "fixed":
        assert np.all(x == spec["value"])
    assert np.array_equal(x, draw(spec, n, seed))
