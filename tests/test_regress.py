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
    """One value a side, the same seed (paired): its difference is compared exactly."""
    rtol = 0.0 if metric == "completed" else 0.02
    (d,) = compare({metric: base}, {metric: cur}, [metric], rtol, paired=True)
    assert d.status == status, d.describe()
    assert d.rule == "exact" and "exact, 1 shared seed" in d.describe()


def test_one_unpaired_seed_has_no_interval():
    """One seed on a side and none shared: not an interval of zero width (which made a 5-seed
    mean against one seed's value fail on noise), but not evaluable, a failure."""
    for base, cur in ((100.0, [100, 101, 99, 100.5, 99.5]), ([100, 101, 99], 100.0)):
        (d,) = compare({"p99_ttft_ms": base}, {"p99_ttft_ms": cur}, ["p99_ttft_ms"], 0.02)
        assert d.status == "not evaluable" and d.failed, d.describe()
        assert "single seed" in d.describe() and "no interval" in d.describe()


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
    assert entry["seeds"] == list(range(1, DEFAULT_SEEDS + 1))  # seed + 0 .. seed + DEFAULT_SEEDS - 1
    assert entry["metrics"]["p99_ttft_ms"] == [40.0] * DEFAULT_SEEDS  # one value per seed
    assert f'"p99_ttft_ms": [{", ".join(["40.0"] * DEFAULT_SEEDS)}],' in text  # one line per metric
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
    doc["scenarios"]["sc/a.yaml"]["metrics"]["p99_ttft_ms"] = [30.0] * DEFAULT_SEEDS  # the baseline was faster
    doc["scenarios"]["sc/a.yaml"]["metrics"]["median_e2el_ms"] = [20.0] * DEFAULT_SEEDS  # ... and this much slower
    base.write_text(json.dumps(doc))
    rep = regress([sc], base, runner=fake_runner)
    assert rep.exit_code == 1
    [(s, d)] = rep.rows("regressed")
    assert (s.key, d.metric, d.baseline, d.current) == ("sc/a.yaml", "p99_ttft_ms", 30.0, 40.0)
    # the means, then the paired difference the decision used (item: not each side's own ±)
    assert f"p99_ttft_ms: 30 -> 40 (+33.3%): Δ +10 ± 0 (paired, {DEFAULT_SEEDS} seeds), tolerance ±0.6" in d.describe()
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
    doc["scenarios"]["sc/b.yaml"]["metrics"]["output_throughput"] = [150.0] * DEFAULT_SEEDS
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
    assert "sc/b.yaml" in msg and f"output_throughput: 150 -> 100 (-33.3%): Δ -50 ± 0 (paired, {DEFAULT_SEEDS} seeds)" in msg


def test_markdown_summary(recorded):
    sc, base = recorded
    doc = json.loads(base.read_text())
    doc["scenarios"]["sc/a.yaml"]["metrics"]["p99_tpot_ms"] = [30.0] * DEFAULT_SEEDS
    doc["scenarios"]["sc/a.yaml"]["metrics"]["median_ttft_ms"] = [20.0] * DEFAULT_SEEDS
    base.write_text(json.dumps(doc))
    md = to_markdown(regress([sc], base, runner=fake_runner))
    assert md.startswith("<!-- batchsim-regress -->\n## batchsim regress: :x: 1 failing metric")
    reg = md.split("### Regressions")[1].split("###")[0]
    assert f"| `sc/a.yaml` | `p99_tpot_ms` | 30 | 40 | +33.3% | +10 ± 0 (paired, {DEFAULT_SEEDS} seeds) | ±0.6 | 0 |" in reg
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
])
def test_compare_intervals(base, cur, status):
    """No shared seeds (unpaired): Welch's t-test of the two means, and each side's interval shown."""
    (d,) = compare({"p99_ttft_ms": base}, {"p99_ttft_ms": cur}, ["p99_ttft_ms"], 0.02)
    assert d.status == status, d.describe()
    assert d.current_n == 5 and d.current_ci > 0 and d.baseline_ci > 0 and d.rule == "Welch t"
    assert "(unpaired (Welch), 5 and 5 seeds)" in d.describe() and d.describe().count(" ± ") == 3


@pytest.mark.parametrize("metric, sign", [("median_ttft_ms", 1), ("output_throughput", -1)])
def test_paired_rule_is_a_one_sided_t_test_beyond_the_tolerance(metric, sign):
    """Paired: the p-value of "the mean difference lies beyond the tolerance the worse way"
    (Student's t on the seed-by-seed differences), regressed when it is at most 5%."""
    import math
    import statistics

    from batchsim.reports.stats import t_sf

    base = [100.0, 102.0, 98.0, 101.0, 99.0]
    tol = 0.02 * 100.0
    for shift in (2.5, 4.0, 6.0):
        d_s = [sign * (shift + e) for e in (0.5, -0.5, 1.0, -1.0, 0.0)]
        cur = [b + x for b, x in zip(base, d_s)]
        (d,) = compare({metric: base}, {metric: cur}, [metric], 0.02, paired=True)
        se = statistics.stdev(d_s) / math.sqrt(5)
        p = t_sf((shift - tol) / se, 4)
        assert d.p_worse == pytest.approx(p) and d.p_adj == pytest.approx(p)  # a family of one
        assert d.status == ("regressed" if p <= 0.05 else "ok"), (shift, p, d.describe())
    assert [compare({metric: base}, {metric: [b + sign * s for b in base]}, [metric], 0.02, paired=True)[0].status
            for s in (0.99 * tol, 1.01 * tol)] == ["ok", "regressed"]  # no spread: exactly beyond or not


def test_holm_controls_the_family_not_each_check():
    """Twenty checks each at p = 0.01: one alone would fail, but not as one of twenty (Holm
    needs 0.05 / 20 = 0.0025 for the smallest); one very small p-value still fails."""
    from batchsim.reports.regression import decide, measure
    from batchsim.reports.stats import t_sf

    base = [100.0, 102.0, 98.0, 101.0, 99.0]
    noise = (0.5, -0.5, 1.0, -1.0, 0.0)
    import math
    import statistics

    se = statistics.stdev(noise) / math.sqrt(5)
    shift = 2.0 + 3.747 * se  # t(0.99, 4) = 3.747: a one-sided p of about 0.01
    cur = [b + shift + e for b, e in zip(base, noise)]
    groups = [measure({"median_ttft_ms": base}, {"median_ttft_ms": cur}, ["median_ttft_ms"], 0.02, paired=True)
              for _ in range(20)]
    assert groups[0][0].p_worse == pytest.approx(t_sf(3.747, 4)) and 0.009 < groups[0][0].p_worse < 0.011
    assert decide(groups[:1])[0][0].status == "regressed"
    assert {g[0].status for g in decide(groups)} == {"ok"}
    strong = measure({"median_ttft_ms": base}, {"median_ttft_ms": [b + 20 + e for b, e in zip(base, noise)]},
                     ["median_ttft_ms"], 0.02, paired=True)
    decided = decide(groups + [strong])
    assert decided[-1][0].status == "regressed" and {g[0].status for g in decided[:-1]} == {"ok"}


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
    assert doc["format"] == BASELINE_FORMAT and doc["scenarios"]["sc/a.yaml"]["seeds"] == list(range(1, DEFAULT_SEEDS + 1))


def test_seeds_run_with_compare_rule_and_bad_seeds(recorded):
    sc, base = recorded
    seen = []

    def spy(scenario, base_dir):
        seen.append(scenario.seed)
        return fake_runner(scenario, base_dir)

    rep = regress([sc], base, runner=spy, seeds=3)
    assert seen == [1, 2, 3] and rep.seeds == 3
    assert any(f"baseline seeds 1..{DEFAULT_SEEDS}, this run 1..3" in n for n in rep.scenarios[0].notes)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(InputError, match="--seeds"):
            regress([sc], base, runner=fake_runner, seeds=bad)


def test_junit_and_markdown_show_intervals(recorded):
    sc, base = recorded
    rep = regress([sc], base, runner=fake_runner, metrics=["p99_ttft_ms"])
    root = ET.fromstring(to_junit(rep))
    out = root.find("./testsuite/testcase/system-out").text
    assert out.startswith(f"ok: p99_ttft_ms: 40 -> 40 (+0.0%): Δ +0 ± 0 (paired, {DEFAULT_SEEDS} seeds), tolerance ±0.8")
    assert root.find("./testsuite/properties/property[@name='seeds']").get("value") == str(DEFAULT_SEEDS)
    md = to_markdown(rep)
    assert "Δ ± 95% CI (rule)" in md and f"| 40 | 40 | +0.0% | +0 ± 0 (paired, {DEFAULT_SEEDS} seeds) |" in md and f"{DEFAULT_SEEDS} seeds" in md


# ------------------------------------------------ baseline validation (bad values)


@pytest.mark.parametrize("field, value, needle", [
    ("metrics.p99_ttft_ms", "fast", f"got 'fast'; expected a list of {DEFAULT_SEEDS} numbers or nulls"),
    ("metrics.p99_ttft_ms", [True, False, True, False, True], "got [True, False, True, False, True]"),
    ("metrics.p99_ttft_ms", [40.0, 40.0], f"got [40.0, 40.0]; expected a list of {DEFAULT_SEEDS} numbers"),
    ("metrics.p99_ttft_ms", 40.0, f"got 40.0; expected a list of {DEFAULT_SEEDS}"),
    ("metrics.completed", ["200"] * 5, "got ['200', '200', '200', '200', '200']"),
    ("seeds", "7..11", "got '7..11'; expected a list of distinct whole numbers"),
    ("seeds", [1, 1, 2, 3, 4], "expected a list of distinct whole numbers"),
    ("scenario_hash", 5, "got 5; expected a string"),
    ("inputs", [], "expected a mapping of input labels to hashes"),
    ("engine", 3, "got 3; expected the engine name"),
])
def test_malformed_baseline_entry_is_an_input_error_naming_it(recorded, field, value, needle):
    """Each of these read as 'not in the baseline' (exit 1), 'old format', or silently unpaired or
    unchecked: now an InputError naming the file, the scenario key, the field and the value."""
    sc, base = recorded
    doc = json.loads(base.read_text())
    entry = doc["scenarios"]["sc/a.yaml"]
    *parents, last = field.split(".")
    for k in parents:
        entry = entry[k]
    entry[last] = value
    base.write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        regress([sc], base, runner=fake_runner)
    assert e.value.where == f'{base}: scenarios["sc/a.yaml"].{field}' and needle in e.value.message, str(e.value)


def test_non_finite_baseline_value_is_an_input_error(recorded):
    sc, base = recorded
    values = ["40.0"] * DEFAULT_SEEDS
    old = f'"p99_ttft_ms": [{", ".join(values)}]'
    values[1], values[4] = "NaN", "Infinity"
    assert old in base.read_text()
    text = base.read_text().replace(old, f'"p99_ttft_ms": [{", ".join(values)}]')
    base.write_text(text)
    with pytest.raises(InputError, match=r"metrics\.p99_ttft_ms: got \[40.0, nan, 40.0, 40.0, inf, 40.0"):
        load_baseline(base)


# ------------------------------------------------ --metrics and --rtol values


def summary_runner(scenario, base_dir) -> dict:
    """The fake summary with the non-metric keys a real one has."""
    return {**fake_runner(scenario, base_dir), "warnings": [], "rejected_by_reason": {}, "engine": "core",
            "engine_reason": None, "provenance": {"model": "m"}}


@pytest.mark.parametrize("metrics", [["policy"], ["warnings"], ["provenance"], ["rejected_by_reason"],
                                     ["engine_reason"], ["p99_ttft_ms,engine"]])
def test_non_numeric_metrics_are_refused(recorded, metrics):
    sc, base = recorded
    with pytest.raises(InputError, match="not a numeric summary key") as e:
        regress([sc], base, metrics=metrics, runner=summary_runner)
    assert e.value.where == "--metrics"


@pytest.mark.parametrize("metrics", [[","], [" , "], ["", ","]])
def test_metrics_naming_nothing_is_refused(recorded, metrics):
    sc, base = recorded
    with pytest.raises(InputError, match="expected summary keys") as e:
        regress([sc], base, metrics=metrics, runner=fake_runner)
    assert e.value.where == "--metrics"


@pytest.mark.parametrize("rtol", [float("inf"), float("nan"), 1e400, -0.1])
def test_rtol_must_be_finite_and_not_negative(recorded, rtol):
    sc, base = recorded
    with pytest.raises(InputError, match="expected a finite number >= 0") as e:
        regress([sc], base, rtol=rtol, runner=fake_runner)
    assert e.value.where == "--rtol"


# ------------------------------------------------ engines, warnings, provenance


def test_engine_fallback_and_warnings_are_noted_and_in_junit(tmp_path):
    """A rule edit that sends the runs to the SimPy engine was not mentioned anywhere."""
    (tmp_path / "sc").mkdir()
    sc = write_scenario(tmp_path / "sc" / "a.yaml")
    base = tmp_path / "base.json"
    regress([sc], base, update=True, runner=summary_runner)
    assert json.loads(base.read_text())["scenarios"]["sc/a.yaml"]["engine"] == "core"
    why = "the loaded rules differ from those the compiled core implements (x.y)"

    def fallback(scenario, base_dir):
        warn = ["3 of 400 measured requests rejected"] if scenario.seed % 2 else []
        return {**summary_runner(scenario, base_dir), "engine": "python", "engine_reason": why, "warnings": warn}

    rep = regress([sc], base, runner=fallback)
    assert rep.exit_code == 0  # the numbers are the same: a note, not a failure
    notes = rep.scenarios[0].notes
    assert f"engine: seeds 1..{DEFAULT_SEEDS} ran on the python engine (the baseline's: core): {why}" in notes
    assert f"run warning: 3 of 400 measured requests rejected ({(DEFAULT_SEEDS + 1) // 2} of {DEFAULT_SEEDS} seeds)" in notes
    props = {p.get("name"): p.get("value") for p in ET.fromstring(to_junit(rep)).iter("property")}
    assert props["engine"] == "python (baseline: core)" and props["engine_reason"] == why
    assert f"ran on the python engine (the baseline's: core): {why}" in to_markdown(rep)
    rep = regress([sc], base, runner=summary_runner)
    assert not [n for n in rep.scenarios[0].notes if n.startswith("engine")]


def test_provenance_and_reproducing_commands(recorded):
    sc, base = recorded

    def with_provenance(scenario, base_dir):
        return {**summary_runner(scenario, base_dir),
                "provenance": {"model": "llama-3-8b", "hardware": "h100-sxm", "tensor_parallel_size": 1,
                               "dtype": "bf16", "policy": {"name": "continuous", "max_num_seqs": 32}}}

    rep = regress([sc], base, runner=with_provenance, rtol=0.05)
    s = rep.scenarios[0]
    prov = dict(s.provenance)
    assert prov["model"] == "llama-3-8b" and prov["hardware"] == "h100-sxm" and prov["engine"] == "core"
    assert prov["policy"] == '{"max_num_seqs":32,"name":"continuous"}' and prov["run_seeds"] == ",".join(map(str, range(1, DEFAULT_SEEDS + 1)))
    assert prov["batchsim_version"] == __version__
    assert s.command == f"batchsim regress {sc} --baseline {base} --seeds {DEFAULT_SEEDS} --rtol 0.05 --min-requests 100"
    assert s.run_commands == tuple(f"batchsim run {sc} --set seed={i}" for i in range(1, DEFAULT_SEEDS + 1))
    props = {p.get("name"): p.get("value") for p in ET.fromstring(to_junit(rep)).iter("property")}
    assert props["reproduce"] == s.command and props["model"] == "llama-3-8b" and props["run_seed_4"].endswith("seed=5")
    md = to_markdown(rep)
    assert f"reproduce: `{s.command}`" in md and "model llama-3-8b, hardware h100-sxm" in md


# ------------------------------------------------ identical re-records


def test_identical_or_only_within_tolerance(recorded):
    """'ok' within tolerance is not 'identical': a re-record that would change the baseline file
    (the last bits of a sum) is reported, so a stale baseline does not go unnoticed."""
    sc, base = recorded
    rep = regress([sc], base, runner=fake_runner)
    assert rep.scenarios[0].identical and not [n for n in rep.scenarios[0].notes if "identical" in n]

    def last_bits(scenario, base_dir):
        s = fake_runner(scenario, base_dir)
        return {**s, "median_itl_ms": s["median_itl_ms"] * (1 + 2e-16)}

    rep = regress([sc], base, runner=last_bits)
    s = rep.scenarios[0]
    assert rep.exit_code == 0 and not s.identical
    assert any(n.startswith("not identical to the baseline entry: a re-record (--update) would change "
                            f"{DEFAULT_SEEDS} recorded value(s) (first: median_itl_ms at seed 1") for n in s.notes), s.notes
    assert '"identical_to_baseline" value="false"' in to_junit(rep)


@pytest.mark.slow
def test_shipped_baseline_is_what_a_re_record_gives():
    """The committed baselines/baseline.json equals a fresh --update at this commit, byte for byte
    (it drifted by 15 last-digit values when sums changed order, unnoticed: 'within tolerance')."""
    import glob

    from batchsim.app.regress import baseline_text

    b = ROOT / "baselines" / "baseline.json"
    rep = regress(sorted(glob.glob(str(ROOT / "baselines" / "*.yaml"))), b, update=True, write=False)
    assert [s.key for s in rep.scenarios if not s.identical] == [], [n for s in rep.scenarios for n in s.notes]
    assert rep.baseline_text == b.read_text()
    assert baseline_text(load_baseline(b)) == b.read_text()


# ------------------------------------------------ seeds the two sides share


def test_a_one_seed_baseline_is_compared_on_its_seed(tmp_path):
    """A 1-seed baseline against a 5-seed run: the one seed both hold, compared exactly (the
    example CI workflow's case: it failed on unchanged code when the 5-seed interval met a
    zero-width one)."""
    (tmp_path / "sc").mkdir()
    sc = write_scenario(tmp_path / "sc" / "a.yaml")
    base = tmp_path / "base.json"
    regress([sc], base, update=True, runner=fake_runner, seeds=1)

    def noisy(scenario, base_dir):  # the same value at seed 1, noise at the others
        s = fake_runner(scenario, base_dir)
        return {**s, "p99_ttft_ms": s["p99_ttft_ms"] + 10.0 * (scenario.seed - 1) * (-1) ** scenario.seed}

    rep = regress([sc], base, runner=noisy)
    assert rep.exit_code == 0, [d.describe() for d in rep.scenarios[0].diffs]
    assert any("compared on the one seed both hold (1), exactly" in n for n in rep.scenarios[0].notes)
    (d,) = [d for d in rep.scenarios[0].diffs if d.metric == "p99_ttft_ms"]
    assert d.rule == "exact" and d.delta == 0.0
    rep = regress([sc], base, runner=fake_runner, seeds=3)
    assert rep.exit_code == 0


def test_no_shared_seed_with_a_one_seed_side_is_not_evaluable(tmp_path):
    (tmp_path / "sc").mkdir()
    sc = write_scenario(tmp_path / "sc" / "a.yaml")
    base = tmp_path / "base.json"
    regress([sc], base, update=True, runner=fake_runner, seeds=1)
    write_scenario(sc, seed=9)
    doc = json.loads(base.read_text())  # (same inputs but the seed: keep the hash out of the way)
    rep = regress([sc], base, runner=fake_runner)
    assert rep.exit_code == 1
    assert any("no seed shared and a side holds a single seed" in n for n in rep.scenarios[0].notes)
    assert {d.status for d in rep.scenarios[0].diffs} == {"not evaluable"}
    assert doc  # the entry was read, not rejected
