"""`batchsim compare` end to end on a pinned scenario: golden summary.csv, plots, HTML, CLI.

Regenerate the golden file after an intended change of the simulator or the
cost model: ``UPDATE_GOLDEN=1 pytest tests/test_compare.py`` (and say why in
the commit).
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchsim.reports.report import COMPARE_FIGURES
from batchsim.reports.tables import summary_frame
from batchsim.app.cli import app
from batchsim.app.compare import (DEFAULT_POLICIES, compare, describe_workload, parse_policies, report_info, with_policy,
                         with_seed, write_comparison)
from batchsim.app.config import load_scenario, scenario_from_dict
from batchsim.sim.errors import InputError
from batchsim.sim.io import write_csv
from tests.test_report_html import assert_one_series_per_policy, assert_png_not_blank, check_html

GOLDEN = Path(__file__).parent / "golden"
PINNED = GOLDEN / "compare_pinned.yaml"
GOLDEN_CSV = GOLDEN / "compare_pinned_summary.csv"


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    sc = load_scenario(PINNED)
    comp = compare(sc, seeds=1, executor="serial", base_dir=GOLDEN, show_progress=False)  # the golden is one seed
    out = tmp_path_factory.mktemp("compare")
    return comp, out, write_comparison(comp, out)


def _rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def test_summary_csv_matches_golden(pinned):
    _, out, _ = pinned
    text = (out / "summary.csv").read_text()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN_CSV.write_text(text)
    golden = GOLDEN_CSV.read_text()
    got, want = _rows(text), _rows(golden)
    assert list(got[0]) == list(want[0]), "summary.csv columns changed"
    assert [r["policy"] for r in got] == list(DEFAULT_POLICIES)
    for g, w in zip(got, want):
        for key, value in w.items():
            try:  # (numbers to 1e-6; text, the warnings included, exactly)
                got_v, want_v = float(g[key]), float(value)
            except ValueError:
                assert g[key] == value, (g["policy"], key)
                continue
            if key == "policy" or "." not in value + g[key]:
                assert g[key] == value, (g["policy"], key)
            else:
                assert got_v == pytest.approx(want_v, rel=1e-6, abs=1e-9), (g["policy"], key)


def test_same_scenario_and_seed_give_byte_identical_csv_even_from_a_process_pool(pinned, tmp_path):
    _, out, _ = pinned
    comp = compare(load_scenario(PINNED), seeds=1, executor="local", workers=2, show_progress=False)
    write_csv(tmp_path / "summary.csv", summary_frame(comp.runs))
    assert (tmp_path / "summary.csv").read_bytes() == (out / "summary.csv").read_bytes()


def test_every_policy_sees_the_identical_workload(pinned):
    comp, _, _ = pinned
    first = comp.runs[0].requests[["rid", "arrival", "prompt_tokens", "output_tokens"]]
    for run in comp.runs[1:]:
        assert run.requests[["rid", "arrival", "prompt_tokens", "output_tokens"]].equals(first)
    # static pads, continuous does not: the report's main contrast is real
    eff = {s["policy"]: s["token_efficiency"] for s in comp.summaries}
    assert eff["static"] < 1.0 and eff["continuous"] == 1.0


def test_every_plot_written_non_empty_one_series_per_policy(pinned):
    comp, out, files = pinned
    for name, build, _, _, _ in COMPARE_FIGURES:
        assert files[name].stat().st_size > 0
        assert_png_not_blank(files[name].read_bytes())
        assert_one_series_per_policy(build(comp.runs), list(DEFAULT_POLICIES),
                                     (0,) if name == "token_efficiency.png" else (), name == "timelines.png")


def test_report_html_self_contained_with_header(pinned):
    _, out, _ = pinned
    text = (out / "report.html").read_text(encoding="utf-8")
    c = check_html(text)
    assert len(c.images) == len(COMPARE_FIGURES)
    body = " ".join(c.text)
    for needle in ("pinned-compare", "llama-3-8b", "h100-sxm", "uncalibrated", "batchsim 0.", "TTFT ≤ 1000 ms"):
        assert needle in body, needle


def test_policy_swap_keeps_kv_knobs_and_drops_the_rest():
    sc = load_scenario(PINNED, ["policy.max_num_seqs=4", "policy.gpu_memory_utilization=0.5"])
    assert with_policy(sc, "static").policy == {"name": "static", "block_size": 16, "gpu_memory_utilization": 0.5}
    assert with_policy(sc, "continuous") is sc  # its own policy keeps every knob
    assert with_seed(sc, 3).seed == sc.seed + 3 and with_seed(sc, 3).policy == sc.policy
    assert parse_policies(" static, ,continuous,static") == ("static", "continuous")
    assert parse_policies("") == DEFAULT_POLICIES


def test_header_describes_workload_and_kv():
    sc = load_scenario(PINNED)
    text = describe_workload(sc)
    assert text.startswith("40 requests; arrivals poisson(rate=6.0); prompt lognormal(median=300.0")
    trace = scenario_from_dict({"workload": {"trace": {"format": "csv", "path": "t.csv"}}})
    assert describe_workload(trace) == "trace csv: t.csv"
    info = report_info(sc, [{"kv_capacity_tokens": 1000, "block_size": 16}, {"kv_capacity_tokens": 2000}], 1, "x")
    assert dict(info.details)["KV capacity"] == "1,000–2,000 (by policy) tokens per replica (block size 16)"


def test_seeds_report_mean_and_ci(tmp_path):
    sc = load_scenario(PINNED, ["workload.num_requests=12"])
    comp = compare(sc, ["continuous", "chunked_prefill"], seeds=3, executor="serial", show_progress=False)
    assert [r.seeds for r in comp.runs] == [3, 3]
    seeds = {r.summaries[i]["num_requests"] for r in comp.runs for i in range(3)}
    assert seeds == {12}
    ttfts = [s["median_ttft_ms"] for s in comp.runs[0].summaries]
    assert len(set(ttfts)) == 3  # independent seeds differ
    s = comp.summaries[0]
    assert s["median_ttft_ms"] == pytest.approx(sum(ttfts) / 3) and s["median_ttft_ms_ci95"] > 0
    header = list(summary_frame(comp.runs).columns)
    assert header[:4] == ["policy", "seeds", "num_requests", "num_requests_ci95"]
    assert comp.runs[0].requests is not None and comp.runs[0].steps is not None  # seed 0's records


def test_bad_policy_fails_before_any_run():
    with pytest.raises(InputError, match="policy.name"):
        compare(load_scenario(PINNED), ["continuous", "nope"], executor="serial", show_progress=False)
    with pytest.raises(InputError, match="--seeds"):
        compare(load_scenario(PINNED), seeds=0, executor="serial")


def test_cli_compare_without_a_scenario_runs_the_builtin_example(tmp_path):
    r = CliRunner().invoke(app, ["compare", "--policies", "static,continuous", "--set", "workload.num_requests=8",
                                 "--executor", "serial", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "report:" in r.output and "static" in r.output and "continuous" in r.output
    for name in ("summary.csv", "report.html", *(f[0] for f in COMPARE_FIGURES)):
        assert (tmp_path / "o" / name).is_file(), name
    assert len((tmp_path / "o" / "summary.csv").read_text().splitlines()) == 3
    assert "builtin-chat" in (tmp_path / "o" / "report.html").read_text()


def test_cli_bad_policy_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    import sys

    from batchsim.app.cli import main

    monkeypatch.setattr(sys, "argv", ["batchsim", "compare", str(PINNED), "--policies", "nope",
                                      "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "nope" in err and "Traceback" not in err
