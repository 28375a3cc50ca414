"""The benchmark suite: a tiny real run, the timeout budget, and the comparison rules.

The real runs are kept to a few hundred requests so the file stays well
under 20 s; the comparison, linearity and CLI tests use fabricated result
documents and a patched :func:`bench.suite.benchmark` (the only boundary).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import bench.__main__ as cli
from bench.child import CALIBRATION_VERSION
from bench.compare import compare, flagged, linearity, newest_result
from bench.report import linearity_lines, render
from bench.runner import Limits, run_case
from bench.scenarios import BenchCase, make_cases, parse_sizes, size_label
from bench.suite import benchmark

RESULT_KEYS = {"key", "size", "policy", "load", "replicas", "rate", "status", "code", "loadavg",
               "wall_s", "build_s", "sim_s", "cpu_s", "requests", "completed", "steps",
               "req_per_s", "steps_per_s", "peak_rss_mb", "import_rss_mb", "calibration_s",
               "calibration_cpu_s", "calibration_runs", "ratio", "sim_duration_s"}


def test_smoke_run_writes_the_documented_schema(tmp_path: Path) -> None:
    case = BenchCase(200, "continuous", "moderate", 1)
    old = _doc([("200/continuous/moderate/r1", "ok", 0.01, 1)])  # an impossibly fast previous run
    (tmp_path / "old.json").write_text(json.dumps(old))
    report = benchmark([case], tmp_path, Limits(timeout_s=60), label="smoke", echo=lambda _: None)
    doc = json.loads((tmp_path / "smoke.json").read_text())
    assert doc == report.document
    assert {"schema", "label", "created", "git", "host", "settings", "calibration", "results"} <= set(doc)
    assert doc["calibration"]["version"] == CALIBRATION_VERSION
    assert len(doc["host"]["loadavg_start"]) == 3
    (r,) = doc["results"]
    assert RESULT_KEYS <= set(r), RESULT_KEYS - set(r)
    assert (r["key"], r["status"], r["requests"], r["completed"]) == ("200/continuous/moderate/r1", "ok", 200, 200)
    assert r["steps"] > 0 and r["peak_rss_mb"] > 0
    assert r["wall_s"] == pytest.approx(r["build_s"] + r["sim_s"])
    assert r["req_per_s"] == pytest.approx(200 / r["wall_s"])
    assert r["ratio"] == pytest.approx(r["cpu_s"] / r["calibration_cpu_s"])
    assert r["calibration_cpu_s"] <= r["calibration_s"] * 1.05 and len(r["calibration_runs"]) == 6
    assert report.previous == tmp_path / "old.json" and "| 200/continuous/moderate/r1 | " in report.markdown
    assert [(x["key"], x["flag"]) for x in report.slowdowns] == [("200/continuous/moderate/r1", "slower")]
    assert "Compared with 2025-01-01 (old.json)" in report.markdown
    assert (tmp_path / "smoke.md").read_text() == report.markdown


def test_a_case_past_its_budget_is_recorded_as_timeout() -> None:
    # NOTE: sized so no engine finishes it in 3 s (1M chunked-prefill requests at saturation
    # take ~22 s in the compiled core; 100k took 90 s in the Python engine once, 2.3 s in the core)
    r = run_case(BenchCase(1_000_000, "chunked_prefill", "saturating", 1), Limits(timeout_s=3, grace_s=20))
    assert r["status"] == "timeout"
    if r.get("progress"):  # the child got past its imports before the budget ran out
        assert r["steps_per_s"] >= 0 and r["progress"]["arrived"] <= 1_000_000
        assert len(r["calibration_runs"]) == 6  # timed again at the cutoff


def _doc(rows: list[dict], created: str = "2025-01-01T00:00:00+00:00", version: int = CALIBRATION_VERSION) -> dict:
    results = []
    for key, status, ratio, steps in rows:
        size, policy, load, rep = key.split("/")
        r = {"key": key, "size": parse_sizes(size)[0], "policy": policy, "load": load,
             "replicas": int(rep[1:]), "status": status, "ratio": ratio, "steps": steps}
        if status == "ok":
            r.update(wall_s=ratio / 10, calibration_s=0.1)
        elif status == "timeout":
            r.update(est_wall_s=ratio / 10 if ratio else None, elapsed_s=300)
        results.append(r)
    return {"label": created[:10], "created": created, "calibration": {"version": version}, "results": results}


def test_compare_flags_ratio_slowdowns_beyond_the_threshold() -> None:
    prev = _doc([("10k/continuous/moderate/r1", "ok", 100.0, 50),
                 ("10k/continuous/saturating/r1", "ok", 100.0, 50),
                 ("10k/static/moderate/r1", "ok", 100.0, 50),
                 ("10k/static/saturating/r1", "ok", 100.0, 50),
                 ("100k/static/moderate/r1", "timeout", 1000.0, 9),
                 ("10k/dynamic/moderate/r1", "ok", 100.0, 50)])
    cur = _doc([("10k/continuous/moderate/r1", "ok", 124.0, 50),   # noise
                ("10k/continuous/saturating/r1", "ok", 126.0, 50),  # slower
                ("10k/static/moderate/r1", "ok", 60.0, 40),         # faster, other steps
                ("10k/static/saturating/r1", "timeout", None, 3),   # regressed
                ("100k/static/moderate/r1", "timeout", 1300.0, 9),  # slower, estimated
                ("10k/chunked_prefill/moderate/r1", "ok", 1.0, 1)])  # not in prev: skipped
    rows = {r["key"]: r for r in compare(prev, cur)}
    assert set(rows) == {"10k/continuous/moderate/r1", "10k/continuous/saturating/r1",
                         "10k/static/moderate/r1", "10k/static/saturating/r1", "100k/static/moderate/r1"}
    assert [rows[k]["flag"] for k in sorted(rows)] == [
        "slower (est.)", "", "slower", "faster", "regressed (timeout)"]
    assert rows["10k/continuous/saturating/r1"]["change"] == pytest.approx(0.26)
    assert rows["10k/static/moderate/r1"]["steps_differ"] and not rows["10k/continuous/moderate/r1"]["steps_differ"]
    assert [r["key"] for r in flagged(rows.values())] == [
        "10k/continuous/saturating/r1", "10k/static/saturating/r1", "100k/static/moderate/r1"]
    assert compare(prev, cur, threshold=0.3)[1]["flag"] == ""


def test_compare_refuses_ratios_from_another_calibration_loop() -> None:
    prev = _doc([("10k/continuous/moderate/r1", "ok", 100.0, 5)], version=CALIBRATION_VERSION + 1)
    assert compare(prev, _doc([("10k/continuous/moderate/r1", "ok", 900.0, 5)])) == []


def test_newest_result_goes_by_created_stamp_not_file_time(tmp_path: Path) -> None:
    for name, created in (("b", "2025-03-01T00:00:00+00:00"), ("a", "2025-05-01T00:00:00+00:00"),
                          ("c", "2025-01-01T00:00:00+00:00")):
        (tmp_path / f"{name}.json").write_text(json.dumps(_doc([], created)))
    os.utime(tmp_path / "c.json", (2e9, 2e9))  # newest file time, oldest stamp
    assert newest_result(tmp_path) == tmp_path / "a.json"
    assert newest_result(tmp_path, exclude=[tmp_path / "a.json"]) == tmp_path / "b.json"
    assert newest_result(tmp_path / "none") is None
    (tmp_path / "d.json").write_text(json.dumps(_doc([("1M/continuous/saturating/r1", "timeout", None, 1)],
                                                     "2025-09-01T00:00:00+00:00")))
    assert newest_result(tmp_path) == tmp_path / "d.json"
    assert newest_result(tmp_path, keys=["10k/static/moderate/r1"]) is None  # a, b, c hold no case
    assert newest_result(tmp_path, keys=["1M/continuous/saturating/r1"]) == tmp_path / "d.json"


def test_linearity_ratios_between_sizes() -> None:
    doc = _doc([("10k/continuous/moderate/r1", "ok", 40.0, 1), ("100k/continuous/moderate/r1", "ok", 440.0, 1),
                ("1M/continuous/moderate/r1", "timeout", 8800.0, 1), ("10k/static/moderate/r1", "memory", None, 0)])
    rows = {g["policy"]: g for g in linearity(doc)}
    pts = rows["continuous"]["points"]
    assert [p["ratio"] for p in pts[1:]] == pytest.approx([11.0, 20.0])
    assert [p["estimate"] for p in pts] == [False, False, True]
    assert linearity_lines([rows["continuous"]]) == (
        "- continuous moderate r1: 10k 4.0 s -> 100k 44.0 s (x11.0; ideal x10) -> 1M ~880.0 s (x20.0; ideal x10)")
    assert linearity_lines([rows["static"]]) == "- static moderate r1: 10k memory"


def test_render_mentions_the_previous_file_and_a_code_change() -> None:
    doc = _doc([("10k/continuous/moderate/r1", "ok", 100.0, 5)])
    doc.update(git={"commit": "abc", "dirty": True, "code": "x"},
               host={"python": "3.11", "cpus": 2, "loadavg_start": [1.0, 1, 1]})
    doc["calibration"].update(median_s=0.1, median_cpu_s=0.05)
    doc["results"][0].update(code="x", loadavg=[1.0, 1, 1], req_per_s=1000.0, steps_per_s=5.0, peak_rss_mb=10.0,
                             cpu_s=9.5)
    doc["results"].append(dict(doc["results"][0], key="10k/static/moderate/r1", code="y"))
    text = render(doc, [], "old", [])
    assert "No case to compare with old" in text and "sources changed during this run (code x, y)" in text
    assert "| 10k/continuous/moderate/r1 | 10.0 | 9.5 | 1,000 | 5 | 10 | 5 | 100 | 1.00 |" in text


def test_sizes_and_cases() -> None:
    assert parse_sizes("1M, 10k,100k,10k,2500") == (2500, 10_000, 100_000, 1_000_000)
    assert [size_label(n) for n in (2500, 10_000, 1_000_000)] == ["2500", "10k", "1M"]
    for bad in ("", "ten", "0", "1.5"):
        with pytest.raises(ValueError):
            parse_sizes(bad)
    cases = make_cases((100_000, 10_000), ("static", "continuous"), ("saturating",), (4,))
    assert [c.key for c in cases] == ["10k/static/saturating/r4", "10k/continuous/saturating/r4",
                                      "100k/static/saturating/r4", "100k/continuous/saturating/r4"]
    assert cases[1].rate == pytest.approx(6.5 * 2 * 4)
    assert cases[1].scenario()["workload"]["arrival"] == {"process": "poisson", "rate": 52.0}
    with pytest.raises(ValueError, match="unknown policy fifo"):
        make_cases(policies=("fifo",))


def test_cli_quick_passes_10k_and_the_quick_budget(monkeypatch, tmp_path: Path) -> None:
    seen = {}

    def fake(cases, out, limits, label, compare_to, threshold, echo):
        seen.update(cases=cases, out=out, limits=limits)

        class R:  # the fields the CLI prints
            markdown, json_path, markdown_path, slowdowns = "table", out / "x.json", out / "x.md", [{"key": "k", "flag": "slower"}]
        return R

    monkeypatch.setattr(cli, "benchmark", fake)
    runner = CliRunner()
    res = runner.invoke(cli.app, ["--quick", "--policies", "continuous", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert {c.size for c in seen["cases"]} == {10_000} and len(seen["cases"]) == 4
    assert seen["limits"].timeout_s == cli.QUICK_TIMEOUT_S
    assert "1 case(s) flagged: k slower" in res.output
    assert runner.invoke(cli.app, ["--out", str(tmp_path), "--fail-on-slowdown"]).exit_code == 1
    assert runner.invoke(cli.app, ["--sizes", "10k", "--timeout", "9", "--out", str(tmp_path)]).exit_code == 0
    assert seen["limits"].timeout_s == 9 and len(seen["cases"]) == 16
    bad = runner.invoke(cli.app, ["--policies", "fifo"])
    assert bad.exit_code == 2 and "unknown policy fifo" in bad.output
