"""Confidence intervals over seeds and the summary tables built from them."""

from __future__ import annotations

import math

import pytest

from batchsim.reports.stats import aggregate, mean_ci, t975
from batchsim.reports.tables import LATENCY_COLUMNS, Column, format_cell, summary_frame
from tests.test_report_records import hand_runs


@pytest.mark.parametrize("df, t", [(1, 12.706205), (2, 4.302653), (4, 2.776445), (9, 2.262157),
                                   (30, 2.042272), (31, 2.039513), (60, 2.000298), (1000, 1.962339)])
def test_t975_matches_student_t(df, t):
    assert t975(df) == pytest.approx(t, abs=2e-6)


def test_t975_rejects_zero_df():
    with pytest.raises(ValueError):
        t975(0)


def test_mean_ci_exact():
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert half == pytest.approx(4.302653 * 1.0 / math.sqrt(3))
    m1, h1 = mean_ci([5.0])
    assert m1 == 5.0 and math.isnan(h1)
    assert mean_ci([4.0, 4.0]) == (4.0, 0.0)


def test_aggregate_keeps_order_and_adds_ci_after_each_key():
    out = aggregate([{"policy": "a", "x": 1, "y": 2.0}, {"policy": "a", "x": 3, "y": 2.0}])
    assert list(out) == ["policy", "x", "x_ci95", "y", "y_ci95"]
    assert out["x"] == 2.0 and out["x_ci95"] == pytest.approx(12.706205 * math.sqrt(2) / math.sqrt(2))
    assert out["y_ci95"] == 0.0


def test_summary_frame_one_seed_is_the_summary_keys():
    df = summary_frame(hand_runs())
    assert list(df["policy"]) == ["static", "continuous"]
    assert list(df.columns) == ["policy", "completed", "median_ttft_ms", "p99_ttft_ms", "token_efficiency"]


def test_summary_frame_several_seeds_has_means_and_cis():
    df = summary_frame(hand_runs(seeds=3))
    assert list(df.columns[:4]) == ["policy", "seeds", "completed", "completed_ci95"]
    assert df["seeds"].tolist() == [3, 3]
    # the hand runs' median TTFT is base + seed index: mean base + 1, CI t(2) * 1 / sqrt(3)
    assert df["median_ttft_ms"].tolist() == [201.0, 101.0]
    assert df["median_ttft_ms_ci95"][0] == pytest.approx(4.302653 / math.sqrt(3))


def test_format_cell_units_and_ci():
    row = {"policy": "a<b", "p99_ttft_ms": 123.456, "p99_ttft_ms_ci95": 7.89, "mfu": 0.1234, "completed": 40}
    cols = {c.key: c for c in LATENCY_COLUMNS}
    assert format_cell(row, cols["p99_ttft_ms"]) == ("123.5", "± 7.9", repr(123.456))
    assert format_cell(row, Column("MFU", "mfu", "pct")) == ("12.3%", "", repr(0.1234))
    assert format_cell(row, cols["completed"]) == ("40", "", "40.0")
    assert format_cell(row, cols["policy"]) == ("a<b", "", "a<b")
    assert format_cell({"x": float("nan")}, Column("x", "x", "f1"))[0] == "–"
