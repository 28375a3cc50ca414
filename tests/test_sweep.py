"""`batchsim sweep`: rates applied to the arrival process, saturation, CSV, figure, CLI."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from batchsim.reports.sweep import mark_saturation, saturation_points, saturation_text, sweep_figure
from batchsim.app.cli import app
from batchsim.app.config import load_scenario, scenario_from_dict
from batchsim.sim.errors import InputError
from batchsim.app.sweep import SweepPoint, SweepTask, parse_rates, sweep, with_rate, write_sweep
from tests.test_report_html import assert_one_series_per_policy, assert_png_not_blank, check_html

PINNED = Path(__file__).parent / "golden" / "compare_pinned.yaml"


def test_parse_rates_sorts_and_dedupes():
    assert parse_rates("4, 1,2,2") == (1.0, 2.0, 4.0)
    assert parse_rates([3, 0.5]) == (0.5, 3.0)


@pytest.mark.parametrize("text", ["", "a,2", "0", "-1", "inf"])
def test_parse_rates_rejects(text):
    with pytest.raises(InputError, match="--rates"):
        parse_rates(text)


def test_with_rate_sets_only_the_rate():
    sc = load_scenario(PINNED, ['workload.arrival={"process": "gamma", "rate": 1.0, "cv": 2.0}'])
    swept = with_rate(sc, 7.5)
    assert swept.workload.arrival.rate == 7.5 and swept.workload.arrival.cv == 2.0
    assert swept.workload.prompt_tokens == sc.workload.prompt_tokens and swept.seed == sc.seed


def test_with_rate_errors_clearly_on_timed_traces_and_rateless_processes():
    data = {"workload": {"trace": {"format": "csv", "path": "t.csv"}}}
    with pytest.raises(InputError, match="supplies its own arrival times"):
        with_rate(scenario_from_dict(data), 2.0)
    onoff = load_scenario(PINNED, ['workload.arrival={"process": "onoff", "rate_on": 5, "mean_on_s": 1, "mean_off_s": 1}'])
    with pytest.raises(InputError, match="no single rate"):
        with_rate(onoff, 2.0)


def test_saturation_rule_and_points():
    frame = pd.DataFrame({"policy": ["a", "a", "a", "b", "b"], "rate": [1, 2, 4, 1, 2],
                          "offered_output_throughput": [100.0, 200, 400, 100, 200],
                          "served_output_throughput": [100.0, 185, 250, 120, 181]})
    marked = mark_saturation(frame)
    assert marked["saturated"].tolist() == [False, False, True, False, False]
    assert marked["served_ratio"].tolist() == pytest.approx([1.0, 0.925, 0.625, 1.2, 0.905])
    assert saturation_points(marked) == {"a": 4.0, "b": None}
    assert saturation_text({"a": 4.0, "b": None}) == ["a: saturates at 4 req/s", "b: kept up at every swept rate"]


def fake_point(task: SweepTask) -> SweepPoint:
    """A sweep worker double: capacity 10 req/s x 100 tokens, seed-dependent noise."""
    r, i = task.rate, task.run.seed_index
    served = min(r, 10.0) * 100.0 * (1 + 0.01 * i)
    row = {"policy": task.run.label, "rate": r, "seed_index": i,
           "offered_output_throughput": r * 100.0, "served_output_throughput": served,
           "completed": 10, "median_ttft_ms": 10.0 * r + i, "p99_ttft_ms": 30.0 * r + i,
           "median_tpot_ms": 5.0 + i, "p99_tpot_ms": 9.0 + i, "output_throughput": served,
           "request_goodput": min(r, 10.0), "rejected": 0}
    return SweepPoint(row, {"model": "m", "hardware": "h", "calibrated": False})


def test_sweep_aggregates_seeds_with_ci(tmp_path):
    sc = load_scenario(PINNED)
    res = sweep(sc, [5, 20, 40], ["continuous", "static"], seeds=3, executor="serial", out_dir=tmp_path,
                show_progress=False, task_fn=fake_point)
    f = res.frame
    assert list(f.columns[:7]) == ["policy", "rate", "seeds", "offered_output_throughput",
                                  "served_output_throughput", "served_ratio", "saturated"]
    assert f["policy"].tolist() == ["continuous"] * 3 + ["static"] * 3
    assert f["median_ttft_ms"].tolist()[:3] == [51.0, 201.0, 401.0]
    assert f["median_ttft_ms_ci95"][0] == pytest.approx(4.302653 / math.sqrt(3))  # x, x+1, x+2
    assert res.saturation == {"continuous": 20.0, "static": 20.0}
    assert len(res.runs) == 2 * 3 * 3 and res.simulated == 2 * 3 * 3 and res.reused == 0  # every point
    assert len(list((tmp_path / "points").glob("*.json"))) == 2 * 3 * 3  # each stored as it finished
    assert [k.split("(")[0] for k in res.policy_knobs] == ["continuous", "static"]


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory):
    sc = load_scenario(PINNED, ["workload.num_requests=30"])
    out = tmp_path_factory.mktemp("sweep")
    res = sweep(sc, [1, 60], ["static", "continuous"], seeds=1, executor="serial", out_dir=out, show_progress=False)
    return res, out, write_sweep(res, out)


def test_real_sweep_points_and_saturation(real_sweep):
    res, out, files = real_sweep
    f = res.frame
    assert len(f) == 4 and set(f["policy"]) == {"static", "continuous"}
    offered = f.groupby("rate")["offered_output_throughput"].nunique()
    assert offered.tolist() == [1, 1]  # every policy sees the same workload at a rate
    sat = dict(zip(zip(f["policy"], f["rate"]), f["saturated"]))
    assert sat[("static", 60.0)] and not sat[("continuous", 1.0)]
    assert res.saturation["static"] is not None and not math.isnan(res.saturation["static"])
    assert all("tokens per replica" in k for k in res.policy_knobs)
    csv = (out / "sweep.csv").read_text().splitlines()
    assert csv[0].startswith("policy,rate,offered_output_throughput,served_output_throughput,served_ratio,saturated,")
    assert len(csv) == 5


def test_sweep_figure_and_report(real_sweep):
    res, out, files = real_sweep
    assert_png_not_blank(files["sweep.png"].read_bytes())
    assert_one_series_per_policy(sweep_figure(res.frame, res.policies), ["static", "continuous"])
    text = files["report.html"].read_text(encoding="utf-8")
    c = check_html(text)
    assert len(c.images) == 1 and "saturates at" in text and "90%" in text


def test_cli_sweep(tmp_path):
    r = CliRunner().invoke(app, ["sweep", str(PINNED), "--rates", "2,40", "--policies", "continuous",
                                 "--set", "workload.num_requests=10", "--executor", "serial",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "continuous:" in r.output and "report:" in r.output
    for name in ("sweep.csv", "sweep_runs.csv", "sweep.png", "report.html"):
        assert (tmp_path / name).is_file(), name


def test_a_saturation_point_on_a_short_load_window_says_it_may_be_early():
    import pandas as pd

    from batchsim.reports.sweep import mark_saturation, saturation_points, saturation_text

    frame = mark_saturation(pd.DataFrame({
        "policy": ["a", "a", "b", "b"], "rate": [10.0, 20.0, 10.0, 20.0],
        "offered_output_throughput": [100.0, 200.0, 100.0, 200.0],
        "served_output_throughput": [100.0, 150.0, 100.0, 150.0],
        "load_window_s": [30.0, 15.0, 300.0, 150.0], "median_e2el_ms": [1000.0, 3000.0, 1000.0, 3000.0],
        "p99_e2el_ms": [5000.0, 9000.0, 5000.0, 9000.0]}))
    assert list(frame["window_e2els"]) == [30.0, 5.0, 300.0, 50.0]
    # (what a steady state needs: 10 median and 5 p99 E2Es, 45 s at 20 req/s)
    assert list(frame["window_steady_share"]) == pytest.approx([30 / 25, 15 / 45, 300 / 25, 150 / 45])
    lines = saturation_text(saturation_points(frame), "rate", frame)
    assert lines[0].startswith("a: saturates at 20 req/s (SHORT: its load window there spans 33% of what a steady "
                               "state needs, 10 median and 5 p99 E2E times (5.0 median E2Es)")
    assert lines[1] == "b: saturates at 20 req/s"
    # (a long tail alone makes a window short: 50 median E2Es but under 5 p99 E2Es)
    tail = mark_saturation(frame.drop(columns=["window_e2els", "window_steady_share", "served_ratio", "saturated"])
                           .assign(p99_e2el_ms=[5000.0, 40000.0, 5000.0, 40000.0]))
    assert "SHORT" in saturation_text(saturation_points(tail), "rate", tail)[1]
    assert saturation_text(saturation_points(frame), "rate") == ["a: saturates at 20 req/s", "b: saturates at 20 req/s"]
