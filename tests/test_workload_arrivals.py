"""Arrival processes: exact values, statistics on 100k requests, and properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from batchsim.workloads import arrivals
from batchsim.workloads.config import ArrivalConfig

ARRIVAL = TypeAdapter(ArrivalConfig)


def gen(spec: dict, n: int | None = None, duration: float | None = None, seed: int = 0) -> np.ndarray:
    return arrivals.generate(ARRIVAL.validate_python(spec), np.random.default_rng(seed), n, duration)


def rate_and_cv(t: np.ndarray) -> tuple[float, float]:
    gaps = np.diff(t)
    return (len(t) - 1) / t[-1], gaps.std() / gaps.mean()


def test_constant_is_exact():
    assert gen({"process": "constant", "rate": 4}, n=5).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert gen({"process": "constant", "rate": 4}, duration=1.0).tolist() == [0.0, 0.25, 0.5, 0.75]
    assert gen({"process": "constant", "rate": 4}, n=2, duration=1.0).tolist() == [0.0, 0.25]


@pytest.mark.parametrize("spec", [
    {"process": "poisson", "rate": 0}, {"process": "gamma", "rate": 0, "cv": 2}, {"process": "constant", "rate": 0},
    {"process": "onoff", "rate_on": 0, "rate_off": 0, "mean_on_s": 1, "mean_off_s": 1},
    {"process": "diurnal", "rate": 0, "amplitude": 0.5, "period_s": 10},
])
def test_zero_rate_gives_no_requests(spec):
    assert len(gen(spec, n=1000)) == 0
    assert len(gen(spec, duration=1000.0)) == 0


def test_a_rate_so_small_its_gaps_overflow_yields_only_the_first_request():
    assert gen({"process": "poisson", "rate": 5e-324}, n=3).tolist() == [0.0]
    assert gen({"process": "constant", "rate": 5e-324}, n=3).tolist() == [0.0]


def test_zero_count_or_duration_gives_no_requests():
    assert len(gen({"process": "poisson", "rate": 3}, n=0)) == 0
    assert len(gen({"process": "poisson", "rate": 3}, duration=0.0)) == 0


def test_poisson_rate_and_cv_on_100k():
    rate, cv = rate_and_cv(gen({"process": "poisson", "rate": 5.0}, n=100_000))
    assert rate == pytest.approx(5.0, rel=0.02)  # the estimate's sd is 0.3%
    assert cv == pytest.approx(1.0, rel=0.02)


def test_poisson_count_over_a_duration():
    t = gen({"process": "poisson", "rate": 50.0}, duration=2000.0, seed=1)
    assert len(t) == pytest.approx(100_000, rel=0.02) and t[-1] < 2000.0


@pytest.mark.parametrize("cv", [0.25, 1.0, 2.0, 4.0])
def test_gamma_rate_and_cv_on_100k(cv):
    rate, got = rate_and_cv(gen({"process": "gamma", "rate": 8.0, "cv": cv}, n=100_000, seed=2))
    assert rate == pytest.approx(8.0, rel=0.05)
    assert got == pytest.approx(cv, rel=0.06)


def test_onoff_mean_rate_and_burstiness():
    spec = {"process": "onoff", "rate_on": 20.0, "rate_off": 2.0, "mean_on_s": 5.0, "mean_off_s": 15.0}
    t = gen(spec, n=100_000, seed=3)
    rate, cv = rate_and_cv(t)
    assert rate == pytest.approx((20 * 5 + 2 * 15) / 20, rel=0.06)
    assert cv > 1.3  # bursts: far more variable than Poisson
    t = gen(spec, duration=20_000.0, seed=4)
    assert len(t) == pytest.approx(6.5 * 20_000, rel=0.06) and t[-1] < 20_000.0


def test_diurnal_mean_rate_and_shape():
    spec = {"process": "diurnal", "rate": 10.0, "amplitude": 0.8, "period_s": 100.0, "phase_s": 0.0}
    t = gen(spec, duration=10_000.0, seed=5)
    assert len(t) == pytest.approx(100_000, rel=0.02)
    # rate ~ 1 + A cos(2 pi t / P): the half period around each peak holds 1/2 + A/pi of the arrivals
    phase = (t % 100.0) / 100.0
    near_peak = np.mean((phase < 0.25) | (phase >= 0.75))
    assert near_peak == pytest.approx(0.5 + 0.8 / np.pi, abs=0.01)
    rate, _ = rate_and_cv(gen(spec, n=100_000, seed=6))
    assert rate == pytest.approx(10.0, rel=0.03)


def test_onoff_keeps_its_stationary_start():
    # rate_off 0 and off periods 6x the on ones: a stationary start is off 6 times in 7. Shifting the
    # process so its own first arrival was at 0 cut every starting silence out: 95 in the first 10 s.
    spec = {"process": "onoff", "rate_on": 20.0, "rate_off": 0.0, "mean_on_s": 5.0, "mean_off_s": 30.0}
    first = np.array([(gen(spec, n=3000, seed=s) < 10.0).sum() for s in range(400)])
    # E[arrivals in [0, 10)] = 10 x the mean rate 100/35, plus the request at 0
    expected = 1 + 10 * 100 / 35
    assert abs(first.mean() - expected) < 4 * first.std() / np.sqrt(len(first)), (first.mean(), expected)


@pytest.mark.parametrize("phase_s", [0.0, 1800.0, 2700.0])
def test_diurnal_peaks_at_phase_s(phase_s):
    # amplitude 1 and the peak at 1800 s: the rate at 0 is 0, so the process's first arrival comes late;
    # shifting it to 0 moved the peak to ~1693 s. Circular mean of the arrival angles over 50 runs (sd ~3 s).
    spec = {"process": "diurnal", "rate": 1.0, "amplitude": 1.0, "period_s": 3600.0, "phase_s": phase_s}
    angles = np.concatenate([2 * np.pi * gen(spec, duration=3600.0, seed=s)[1:] / 3600 for s in range(50)])
    peak = np.angle(np.exp(1j * angles).mean()) * 3600 / (2 * np.pi)
    assert abs((peak - phase_s + 1800) % 3600 - 1800) < 15.0, peak


def test_first_arrival_is_at_zero_for_every_process():
    for spec in SPECS_FIXED:
        assert gen(spec, n=10)[0] == 0.0


SPECS_FIXED = [
    {"process": "poisson", "rate": 3}, {"process": "gamma", "rate": 3, "cv": 3}, {"process": "constant", "rate": 3},
    {"process": "onoff", "rate_on": 3, "rate_off": 0, "mean_on_s": 2, "mean_off_s": 9},
    {"process": "diurnal", "rate": 3, "amplitude": 1.0, "period_s": 7, "phase_s": 3},
]

rates = st.floats(0.01, 1000.0)
specs = st.one_of(
    st.builds(lambda r: {"process": "poisson", "rate": r}, rates),
    st.builds(lambda r, cv: {"process": "gamma", "rate": r, "cv": cv}, rates, st.floats(0.05, 10.0)),
    st.builds(lambda r: {"process": "constant", "rate": r}, rates),
    st.builds(lambda a, b, on, off: {"process": "onoff", "rate_on": a, "rate_off": b, "mean_on_s": on, "mean_off_s": off},
              rates, st.floats(0.0, 100.0), st.floats(0.01, 100.0), st.floats(0.01, 100.0)),
    st.builds(lambda r, a, p, ph: {"process": "diurnal", "rate": r, "amplitude": a, "period_s": p, "phase_s": ph},
              rates, st.floats(0.0, 1.0), st.floats(0.1, 1e5), st.floats(-1e4, 1e4)),
)


@settings(max_examples=150, deadline=None)
@given(spec=specs, n=st.integers(0, 500), seed=st.integers(0, 2**32 - 1))
def test_count_order_origin_and_determinism(spec, n, seed):
    t = gen(spec, n=n, seed=seed)
    assert t.dtype == np.float64 and len(t) == n
    assert np.all(np.diff(t) >= 0) and np.all(np.isfinite(t))
    if n:
        assert t[0] == 0.0
    assert np.array_equal(t, gen(spec, n=n, seed=seed))


@settings(max_examples=150, deadline=None)
@given(spec=specs, duration=st.floats(0.0, 50.0), n=st.one_of(st.none(), st.integers(0, 300)),
       seed=st.integers(0, 2**32 - 1))
def test_duration_bounds_the_span(spec, duration, n, seed):
    t = gen(spec, n=n, duration=duration, seed=seed)
    assert np.all(np.diff(t) >= 0)
    assert len(t) == 0 or (t[0] == 0.0 and t[-1] < duration)
    if n is not None:
        assert len(t) <= n
    assert np.array_equal(t, gen(spec, n=n, duration=duration, seed=seed))
