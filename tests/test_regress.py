"""The regression gate's logic with a fake runner: directions, tolerances,
hashes, baseline files, JUnit and markdown. No simulation runs here (see
test_regress_cli.py and test_regress_plugin.py for the real thing)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from batchsim.reports.regression import DEFAULT_METRICS, compare, metric_spec, to_junit, to_markdown
from batchsim import __version__
from batchsim.app.config import load_scenario
from batchsim.sim.errors import InputError
from batchsim.app.regress import (BASELINE_FORMAT, DEFAULT_SEEDS, load_baseline, regress, scenario_inputs,
                                  scenario_key)

ROOT = Path(__file__).resolve().parents[1]

SCENARIO = {
    "name": "fake",
    "policy": {"name": "continuous", "max_num_seqs": 32},
    "workload": {"num_requests": 10, "arrival": {"process": "poisson", "rate": 1.0}},
    "seed": 1,
}


def fake_runner(scenario, base_dir) -> dict:
    """A summary that moves with the policy's max_num_seqs: fewer slots, slower."""
    slots = scenario.policy.get("max_num_seqs", 256)
    s = {"policy": scenario.policy["name"], "completed": 200, "rejected": 0, "unfinished": 0,
         "request_throughput": slots / 32.0, "output_throughput": 100.0 * slots / 32.0,
         "request_goodput": slots / 32.0, "num_steps": 500}
    for m in ("ttft", "tpot", "itl", "e2el"):
        s[f"median_{m}_ms"] = 10.0 * 32 / slots
        s[f"p99_{m}_ms"] = 40.0 * 32 / slots
    return s


def write_scenario(path: Path, **changes) -> Path:
    data = json.loads(json.dumps(SCENARIO))
    for k, v in changes.items():
        data[k] = v
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def recorded(tmp_path):
    """A scenario and a baseline recorded from it with the fake runner."""
    (tmp_path / "sc").mkdir()
    sc = write_scenario(tmp_path / "sc" / "a.yaml")
    base = tmp_path / "base.json"
    rep = regress([sc], base, update=True, runner=fake_runner)
    assert rep.exit_code == 0 and rep.updated
    return sc, base


# ------------------------------------------------------------------ compare


@pytest.mark.parametrize("metric, base, cur, status", [
    ("p99_ttft_ms", 100.0, 101.9, "ok"),          # within 2%
    ("p99_ttft_ms", 100.0, 103.0, "regressed"),   # latency up is worse
    ("p99_ttft_ms", 100.0, 90.0, "improved"),
    ("output_throughput", 1000.0, 970.0, "regressed"),  # throughput down is worse
    ("output_throughput", 1000.0, 1100.0, "improved"),
    ("completed", 300, 299, "regressed"),          # fewer completed is worse... beyond atol
    ("rejected", 0, 1, "regressed"),               # 0 -> 1: the absolute floor still catches it
    ("rejected", 3, 0, "improved"),
    ("median_itl_ms", 0.0, 0.05, "ok"),            # near zero: atol keeps it from flapping
    ("num_steps", 500, 520, "changed"),            # no direction: any change beyond tolerance
])
def test_compare_directions(metric, base, cur, status):
    rtol = 0.0 if metric == "completed" else 0.02
    (d,) = compare({metric: base}, {metric: cur}, [metric], rtol)
    assert d.status == status, d.describe()


def test_compare_missing_and_unavailable():
    d1, d2 = compare({"a_ms": 1.0}, {"b_ms": 2.0}, ["b_ms", "a_ms"], 0.02)
    assert (d1.status, d2.status) == ("missing", "unavailable")
    assert d1.failed and d2.failed


def test_specs_of_defaults():
    better = {m: metric_spec(m).better for m in DEFAULT_METRICS}
    assert better["p99_ttft_ms"] == better["rejected"] == "lower"
    assert better["output_throughput"] == better["request_goodput"] == better["completed"] == "higher"


# ------------------------------------------------------------------ baseline


def test_update_writes_readable_baseline(recorded):
    sc, base = recorded
    text = base.read_text()
    assert text.startswith("{\n  ") and text.endswith("}\n")  # indented, human-readable
    doc = json.loads(text)
    assert doc["format"] == BASELINE_FORMAT
    entry = doc["scenarios"]["sc/a.yaml"]  # keyed relative to the baseline file
    assert entry["batchsim_version"] == __version__
    assert entry["scenario_hash"].startswith("sha256:")
    assert entry["seeds"] == [1, 2, 3, 4, 5]  # seed + 0 .. seed + DEFAULT_SEEDS - 1
    assert entry["metrics"]["p99_ttft_ms"] == [40.0] * DEFAULT_SEEDS  # one value per seed
    assert '"p99_ttft_ms": [40.0, 40.0, 40.0, 40.0, 40.0],' in text  # one line per metric
    assert entry["policy"] == "continuous" and entry["name"] == "fake"


def test_unchanged_passes_and_rerecord_is_byte_identical(recorded):
    sc, base = recorded
    before = base.read_bytes()
    rep = regress([sc], base, runner=fake_runner)
    assert rep.exit_code == 0 and not rep.rows("regressed", "improved")
    assert len(rep.scenarios[0].diffs) == len(DEFAULT_METRICS)
    regress([sc], base, update=True, runner=fake_runner)
    assert base.read_bytes() == before


def test_key_independent_of_cwd(recorded, monkeypatch):
    sc, base = recorded
    monkeypatch.chdir(sc.parent)
    rep = regress([Path("a.yaml")], Path("..") / "base.json", runner=fake_runner)
    assert rep.exit_code == 0 and rep.scenarios[0].key == "sc/a.yaml"


def test_missing_baseline_is_input_error(tmp_path):
    sc = write_scenario(tmp_path / "a.yaml")
    with pytest.raises(InputError, match="baseline file not found.*--update"):
        regress([sc], tmp_path / "none.json", runner=fake_runner)


@pytest.mark.parametrize("content, needle", [
    ("not json", "not a JSON baseline"),
    ('{"format": "other"}', "unknown baseline format"),
    (json.dumps({"format": BASELINE_FORMAT, "scenarios": {"a": {}}}), "'scenarios' must map"),
])
def test_bad_baseline_is_input_error(tmp_path, content, needle):
    p = tmp_path / "b.json"
    p.write_text(content)
    with pytest.raises(InputError, match=needle):
        load_baseline(p)


def test_unknown_metric_and_bad_rtol(recorded):
    sc, base = recorded
    with pytest.raises(InputError, match="unknown metric 'p99_nope_ms'"):
        regress([sc], base, metrics=["p99_nope_ms"], runner=fake_runner)
    with pytest.raises(InputError, match="--rtol"):
        regress([sc], base, rtol=-1, runner=fake_runner)


def test_metrics_option_comma_and_repeat(recorded):
    sc, base = recorded
    rep = regress([sc], base, metrics=["p99_ttft_ms,completed", "num_steps", "completed"],
                  runner=fake_runner)
    assert [d.metric for d in rep.scenarios[0].diffs] == ["p99_ttft_ms", "completed", "num_steps"]


def test_regression_names_scenario_metric_and_values(recorded):
    sc, base = recorded
    doc = json.loads(base.read_text())
    doc["scenarios"]["sc/a.yaml"]["metrics"]["p99_ttft_ms"] = 30.0  # the baseline was faster
    doc["scenarios"]["sc/a.yaml"]["metrics"]["median_e2el_ms"] = 20.0  # ... and this much slower
    base.write_text(json.dumps(doc))
    rep = regress([sc], base, runner=fake_runner)
    assert rep.exit_code == 1
    [(s, d)] = rep.rows("regressed")
    assert (s.key, d.metric, d.baseline, d.current) == ("sc/a.yaml", "p99_ttft_ms", 30.0, 40.0)
    assert "p99_ttft_ms: 30 -> 40 ± 0 (+33.3%" in d.describe()  # a hand-set value reads as one seed
    [(_, imp)] = rep.rows("improved")
    assert imp.metric == "median_e2el_ms"


def test_changed_scenario_is_explained_and_fails_until_update(recorded):
    sc, base = recorded
    old_hash = json.loads(base.read_text())["scenarios"]["sc/a.yaml"]["scenario_hash"]
    write_scenario(sc, policy={"name": "continuous", "max_num_seqs": 16})
    rep = regress([sc], base, runner=fake_runner)
    s = rep.scenarios[0]
    assert rep.exit_code == 1 and len(s.problems) == 1
    assert old_hash in s.problems[0] and s.scenario_hash in s.problems[0]
    assert "changed: scenario" in s.problems[0] and "--update" in s.problems[0]
    assert {d.metric for _, d in rep.rows("regressed")} >= {"p99_ttft_ms", "output_throughput"}
    kinds = [f.get("type") for f in ET.fromstring(to_junit(rep)).iter("failure")]
    assert len(kinds) == len(DEFAULT_METRICS)  # no comparison of a changed scenario is valid
    assert set(kinds) == {"regressed", "scenario-changed"}
    rep = regress([sc], base, update=True, runner=fake_runner)
    assert rep.exit_code == 0 and "accepted by --update" in rep.scenarios[0].notes[0]
    assert regress([sc], base, runner=fake_runner).exit_code == 0


def test_equivalent_spellings_hash_alike(tmp_path):
    a = write_scenario(tmp_path / "a.yaml", policy="continuous")
    b = write_scenario(tmp_path / "b.yaml", seed=1,
                       policy={"name": "continuous", "max_num_seqs": 256, "block_size": 16})
    ha = scenario_inputs(load_scenario(a), tmp_path)
    hb = scenario_inputs(load_scenario(b), tmp_path)
    assert ha == hb


def test_referenced_file_content_is_hashed(tmp_path):
    trace = tmp_path / "lens.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n")
    wl = {"num_requests": 1, "trace": {"format": "lengths", "path": "lens.csv"}}
    sc = write_scenario(tmp_path / "a.yaml", workload=wl)
    base = tmp_path / "base.json"
    regress([sc], base, update=True, runner=fake_runner)
    trace.write_text("num_prefill_tokens,num_decode_tokens\n11,5\n")
    rep = regress([sc], base, runner=fake_runner)
    assert rep.exit_code == 1
    assert "changed: file:workload.trace.path" in rep.scenarios[0].problems[0]


def test_version_mismatch_is_noted_not_failed(recorded):
    sc, base = recorded
    doc = json.loads(base.read_text())
    doc["scenarios"]["sc/a.yaml"]["batchsim_version"] = "0.0.1"
    base.write_text(json.dumps(doc))
    rep = regress([sc], base, runner=fake_runner)
    assert rep.exit_code == 0
    assert f"batchsim 0.0.1, this is {__version__}" in rep.scenarios[0].notes[0]
    assert "compared anyway" in rep.scenarios[0].notes[0]


def test_new_scenario_fails_until_recorded_and_update_keeps_others(recorded):
    sc, base = recorded
    other = write_scenario(sc.parent / "b.yaml", name="other")
    rep = regress([sc, other], base, runner=fake_runner)
    assert rep.exit_code == 1
    assert "no baseline entry" in rep.scenarios[1].problems[0]
    assert all(d.status == "missing" for d in rep.scenarios[1].diffs)
    regress([other], base, update=True, runner=fake_runner)
    assert set(json.loads(base.read_text())["scenarios"]) == {"sc/a.yaml", "sc/b.yaml"}
    rep = regress([other], base, runner=fake_runner)
    assert rep.exit_code == 0 and "not checked in this run: sc/a.yaml" in rep.notes[0]


# ------------------------------------------------------------------ outputs


def test_junit_one_case_per_scenario_and_metric(recorded):
    sc, base = recorded
    other = write_scenario(sc.parent / "b.yaml", name="other")
    regress([other], base, update=True, runner=fake_runner)
    doc = json.loads(base.read_text())
    doc["scenarios"]["sc/b.yaml"]["metrics"]["output_throughput"] = 150.0
    base.write_text(json.dumps(doc))
    rep = regress([sc, other], base, metrics=["p99_ttft_ms", "output_throughput", "completed"],
                  runner=fake_runner)
    root = ET.fromstring(to_junit(rep))
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == 2 * 3 == int(root.get("tests"))
    assert {(c.get("classname"), c.get("name")) for c in cases} == {
        (k, m) for k in ("sc/a.yaml", "sc/b.yaml") for m in ("p99_ttft_ms", "output_throughput", "completed")}
    failures = root.findall("./testsuite/testcase/failure")
    assert len(failures) == 1 == int(root.get("failures"))
    msg = failures[0].get("message")
    assert "sc/b.yaml" in msg and "output_throughput: 150 -> 100 ± 0 (-33.3%" in msg  # one seed -> 5 seeds


def test_markdown_summary(recorded):
    sc, base = recorded
    doc = json.loads(base.read_text())
    doc["scenarios"]["sc/a.yaml"]["metrics"]["p99_tpot_ms"] = 30.0
    doc["scenarios"]["sc/a.yaml"]["metrics"]["median_ttft_ms"] = 20.0
    base.write_text(json.dumps(doc))
    md = to_markdown(regress([sc], base, runner=fake_runner))
    assert md.startswith("<!-- batchsim-regress -->\n## batchsim regress: :x: 1 failing metric")
    reg = md.split("### Regressions")[1].split("###")[0]
    assert "| `sc/a.yaml` | `p99_tpot_ms` | 30 | 40 ± 0 | +33.3% |" in reg
    assert "`median_ttft_ms`" in md.split("### Improvements")[1].split("<details>")[0]
    assert "--update" in md


def test_scenario_key_is_relative_posix(tmp_path):
    assert scenario_key(tmp_path / "x" / "s.yaml", tmp_path / "b" / "base.json") == "../x/s.yaml"


# ------------------------------------------------------------------ shipped


def test_shipped_baseline_covers_pinned_scenarios_with_current_hashes():
    """Every pinned scenario has an entry recorded from its current contents.

    (The metrics themselves are checked by `.ci/run`; this catches a scenario
    edited without re-recording, without simulating anything.)"""
    base = ROOT / "baselines" / "baseline.json"
    entries = load_baseline(base)
    pinned = sorted((ROOT / "baselines").glob("*.yaml"))
    assert {scenario_key(p, base) for p in pinned} == set(entries)
    from batchsim.app.regress import combine_hash

    for p in pinned:
        inputs = scenario_inputs(load_scenario(p), p.parent)
        assert entries[scenario_key(p, base)]["scenario_hash"] == combine_hash(inputs), p
    names = {e["policy"] for e in entries.values()}
    assert {"static", "dynamic", "continuous", "chunked_prefill"} <= names


def test_same_file_twice_runs_once_in_order(recorded, monkeypatch):
    sc, base = recorded
    other = write_scenario(sc.parent / "b.yaml", name="other")
    regress([other], base, update=True, runner=fake_runner)
    monkeypatch.chdir(sc.parent)
    rep = regress([sc, other, Path("./a.yaml")], base, runner=fake_runner)
    assert [s.key for s in rep.scenarios] == ["sc/a.yaml", "sc/b.yaml"]


def test_model_given_as_path_is_hashed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = {"hidden_size": 64}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    sc = load_scenario(write_scenario(tmp_path / "a.yaml", model="m"))
    before = scenario_inputs(sc, tmp_path)
    assert set(before) == {"scenario", "file:model"}
    (tmp_path / "m" / "config.json").write_text(json.dumps({"hidden_size": 128}))
    assert scenario_inputs(sc, tmp_path)["file:model"] != before["file:model"]


# ---------------------------------------------------------- not evaluable


def test_compare_a_null_metric_is_not_evaluable_on_either_side():
    d1, d2, d3 = compare({"p99_ttft_ms": 0.0, "a_ms": None, "b_ms": None}, {"p99_ttft_ms": None, "a_ms": 5.0, "b_ms": None},
                         ["p99_ttft_ms", "a_ms", "b_ms"], 0.02)
    assert {d1.status, d2.status, d3.status} == {"not evaluable"} and d1.failed and d2.failed and d3.failed
    assert d1.describe().startswith("p99_ttft_ms: null in this run (no measured request has it): not evaluable")
    assert "null in the baseline and this run" in d3.describe()


def test_a_thin_run_or_baseline_is_not_a_pass(tmp_path):
    (tmp_path / "sc").mkdir()
    sc = write_scenario(tmp_path / "sc" / "a.yaml")
    base = tmp_path / "base.json"

    def thin(scenario, base_dir):
        return {**fake_runner(scenario, base_dir), "completed": 40}

    regress([sc], base, update=True, runner=fake_runner)
    rep = regress([sc], base, runner=thin)
    assert rep.exit_code == 1
    (problem,) = rep.scenarios[0].problems
    assert problem.startswith("not evaluable in this run: only 40 requests completed in the measured window, "
                              "fewer than 100")
    assert regress([sc], base, runner=thin, min_requests=40).scenarios[0].problems == ()  # (completed regressed)
    regress([sc], base, update=True, runner=thin)  # recorded anyway, and the gate still fails on it
    rep = regress([sc], base, runner=thin)
    assert rep.exit_code == 1
    assert [p.split(":")[0] for p in rep.scenarios[0].problems] == ["not evaluable in this run",
                                                                    "not evaluable in the baseline"]
    with pytest.raises(InputError, match="--min-requests"):
        regress([sc], base, runner=thin, min_requests=0)


def test_a_null_gated_metric_recorded_in_the_baseline_fails(tmp_path):
    (tmp_path / "sc").mkdir()
    sc = write_scenario(tmp_path / "sc" / "a.yaml")
    base = tmp_path / "base.json"

    def no_tpot(scenario, base_dir):
        return {**fake_runner(scenario, base_dir), "median_tpot_ms": None, "p99_tpot_ms": None}

    regress([sc], base, update=True, runner=no_tpot)
    assert json.loads(base.read_text())["scenarios"]["sc/a.yaml"]["metrics"]["p99_tpot_ms"] == [None] * DEFAULT_SEEDS
    rep = regress([sc], base, runner=fake_runner)
    bad = {d.metric: d.status for _, d in rep.rows("not evaluable")}
    assert rep.exit_code == 1 and bad == {"median_tpot_ms": "not evaluable", "p99_tpot_ms": "not evaluable"}
    assert "NOT EVALUABLE" not in to_markdown(rep) and "`p99_tpot_ms`" in to_markdown(rep)


# ------------------------------------------------------- intervals (seeds)


@pytest.mark.parametrize("base, cur, status", [
    ([100, 104, 96, 102, 98], [103, 107, 99, 105, 101], "ok"),        # +3%, intervals overlap
    ([100, 101, 99, 100.5, 99.5], [110, 111, 109, 110.5, 109.5], "regressed"),  # +10%, tight
    ([100, 120, 80, 110, 90], [110, 130, 90, 120, 100], "ok"),        # +10% inside the noise
    ([100, 101, 99, 100.5, 99.5], [90, 91, 89, 90.5, 89.5], "improved"),
    (100.0, [100, 101, 99, 100.5, 99.5], "ok"),                       # old one-seed baseline: zero width
    (100.0, [110, 111, 109, 110.5, 109.5], "regressed"),
])
def test_compare_intervals(base, cur, status):
    (d,) = compare({"p99_ttft_ms": base}, {"p99_ttft_ms": cur}, ["p99_ttft_ms"], 0.02)
    assert d.status == status, d.describe()
    assert d.current_n == 5 and d.current_ci > 0 and (d.baseline_ci > 0) == isinstance(base, list)


def test_interval_rule_is_beyond_the_baseline_interval_by_the_tolerance():
    base = [100.0, 102.0, 98.0]
    from batchsim.reports.stats import mean_ci

    b, b_ci = mean_ci(base)
    for gap, status in ((0.99, "ok"), (1.01, "regressed")):
        # a zero-width new interval at base_hi + gap x tol
        cur = b + b_ci + gap * 0.02 * b
        (d,) = compare({"median_ttft_ms": base}, {"median_ttft_ms": [cur, cur]}, ["median_ttft_ms"], 0.02)
        assert d.status == status, d.describe()
    (d,) = compare({"output_throughput": base}, {"output_throughput": [b - b_ci - 3.0] * 2},
                   ["output_throughput"], 0.02)
    assert d.status == "regressed"  # higher is better: the mirror image


def test_old_one_seed_baseline_is_read_with_a_note(tmp_path):
    (tmp_path / "sc").mkdir()
    sc = write_scenario(tmp_path / "sc" / "a.yaml")
    base = tmp_path / "base.json"
    regress([sc], base, update=True, runner=fake_runner)
    doc = json.loads(base.read_text())
    doc["format"] = "batchsim-regress-baseline/1"
    entry = doc["scenarios"]["sc/a.yaml"]
    del entry["seeds"]
    entry["metrics"] = {k: v[0] for k, v in entry["metrics"].items()}
    base.write_text(json.dumps(doc))
    rep = regress([sc], base, runner=fake_runner)
    assert rep.exit_code == 0
    assert any("holds one seed" in n and "--update" in n for n in rep.scenarios[0].notes)
    regress([sc], base, update=True, runner=fake_runner)  # --update writes the new format
    doc = json.loads(base.read_text())
    assert doc["format"] == BASELINE_FORMAT and doc["scenarios"]["sc/a.yaml"]["seeds"] == [1, 2, 3, 4, 5]


def test_seeds_run_with_compare_rule_and_bad_seeds(recorded):
    sc, base = recorded
    seen = []

    def spy(scenario, base_dir):
        seen.append(scenario.seed)
        return fake_runner(scenario, base_dir)

    rep = regress([sc], base, runner=spy, seeds=3)
    assert seen == [1, 2, 3] and rep.seeds == 3
    assert any("baseline seeds 1..5, this run 1..3" in n for n in rep.scenarios[0].notes)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(InputError, match="--seeds"):
            regress([sc], base, runner=fake_runner, seeds=bad)


def test_junit_and_markdown_show_intervals(recorded):
    sc, base = recorded
    rep = regress([sc], base, runner=fake_runner, metrics=["p99_ttft_ms"])
    root = ET.fromstring(to_junit(rep))
    out = root.find("./testsuite/testcase/system-out").text
    assert out.startswith("ok: p99_ttft_ms: 40 ± 0 -> 40 ± 0 (")
    assert root.find("./testsuite/properties/property[@name='seeds']").get("value") == "5"
    md = to_markdown(rep)
    assert "baseline (mean ± 95% CI)" in md and "| 40 ± 0 | 40 ± 0 |" in md and "5 seeds" in md
