"""The whole-process benchmark (bench/user_path.py): a real `batchsim run` child, its record, the table."""

from __future__ import annotations

import json
from pathlib import Path

from bench.scenarios import BenchCase
from bench.user_path import ROOT, main, render, run_user_case


def test_a_case_runs_batchsim_whole_and_records_its_cost() -> None:
    rec = run_user_case(BenchCase(300, "continuous", "moderate", 1), ROOT, timeout_s=120, mem_limit_mb=4000)
    assert rec["status"] == "ok", rec
    assert rec["wall_s"] > 0 and rec["cpu_s"] > 0 and rec["peak_rss_mb"] > 50
    assert set(rec["files"]) == {"manifest.json", "summary.json", "requests.csv", "steps.csv"}
    assert rec["summary"]["completed"] == 300 and rec["summary"]["num_steps"] > 300


def test_a_case_past_its_memory_limit_is_killed_and_says_so() -> None:
    rec = run_user_case(BenchCase(300, "continuous", "moderate", 1), ROOT, timeout_s=120, mem_limit_mb=1)
    assert rec["status"] == "memory" and "files" not in rec


def test_main_writes_the_table_and_compares_by_ratio(tmp_path: Path, capsys) -> None:
    before = {"label": "old", "tree": "t", "cases": [{"key": "300/continuous", "status": "ok", "wall_s": 10.0,
                                                       "cpu_s": 9.0, "peak_rss_mb": 1000.0, "load_avg": 0.5}]}
    (tmp_path / "old-user.json").write_text(json.dumps(before))
    assert main(["--sizes", "300", "--policies", "continuous", "--out", str(tmp_path), "--label", "new"]) == 0
    doc = json.loads((tmp_path / "new-user.json").read_text())
    assert [c["key"] for c in doc["cases"]] == ["300/continuous"]
    text = (tmp_path / "new-user.md").read_text()
    assert "Compared with old" in text and "| 300/continuous | 10.0 |" in text
    assert main(["--sizes", "300", "--policies", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown nope" in capsys.readouterr().err


def test_render_marks_a_killed_case() -> None:
    doc = {"label": "x", "created": "c", "tree": "t", "code": "h", "python": "3", "cpus": 2,
           "cases": [{"key": "1M/static", "status": "memory", "wall_s": 4.0, "cpu_s": 4.0, "peak_rss_mb": 9.0,
                      "load_avg": 1.0}]}
    assert "| 1M/static | memory | 4.0 | 4.0 | 9 | - | - | 1.00 |" in render(doc, None)
