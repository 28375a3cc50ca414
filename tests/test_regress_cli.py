"""`batchsim regress` end to end on real (small, pinned) simulations.

Runs in-process through ``batchsim.app.cli.main`` so exit codes are the console
script's, and so one test can stand in for a scheduler change by swapping
the registered ``continuous`` class for one with a different knob default.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

from batchsim.reports.regression import DEFAULT_METRICS

SCENARIO = """\
name: cli-regress
model: llama-3-8b
hardware: h100-sxm
policy: {name: continuous}
workload:
  num_requests: 200
  arrival: {process: poisson, rate: 12.0}
  prompt_tokens: {dist: lognormal, median: 600, p90: 2500, max: 8000}
  output_tokens: {dist: lognormal, median: 120, p90: 400, max: 1000}
slo: {ttft_ms: 2000, tpot_ms: 100}
seed: 5
"""


def cli(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    """Run the console script in-process: (exit code, stdout, stderr)."""
    return run_cli(capsys, monkeypatch, *args)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A folder with the scenario and a baseline recorded from it (one simulation)."""
    from batchsim.app.regress import regress

    d = tmp_path_factory.mktemp("recorded")
    (d / "s.yaml").write_text(SCENARIO)
    rep = regress([d / "s.yaml"], d / "base.json", update=True)
    assert rep.exit_code == 0
    return d


@pytest.fixture
def work(recorded, tmp_path, monkeypatch):
    """A private copy of the recorded folder, as the working directory."""
    d = tmp_path / "w"
    shutil.copytree(recorded, d)
    monkeypatch.chdir(d)
    return d


def test_unchanged_code_exits_0_with_junit_and_markdown(work, capsys, monkeypatch):
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json",
                       "--junit", "out/junit.xml", "--markdown", "out/summary.md")
    assert code == 0, out
    assert "OK: no regressions in 1 scenario(s)" in out
    root = ET.parse(work / "out" / "junit.xml").getroot()
    cases = root.findall("./testsuite/testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [("s.yaml", m) for m in DEFAULT_METRICS]
    assert root.get("failures") == "0" and not root.findall(".//failure")
    md = (work / "out" / "summary.md").read_text()
    assert ":white_check_mark: no regressions" in md


def test_changed_policy_knob_exits_1_naming_scenario_metric_and_values(work, capsys, monkeypatch):
    """A scheduler change: the code's default max_num_seqs drops from 256 to 4.

    The scenario file is untouched (it leaves the knob at its default), so its
    hash still matches and the metrics alone must catch the change."""
    from batchsim.policies import registry
    from batchsim.policies.continuous import ContinuousConfig, ContinuousPolicy

    class SmallerConfig(ContinuousConfig):
        max_num_seqs: int = 4

    class Changed(ContinuousPolicy):
        Config = SmallerConfig

    monkeypatch.setitem(registry._REGISTRY, "continuous", Changed)
    base = json.loads((work / "base.json").read_text())["scenarios"]["s.yaml"]["metrics"]
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json",
                       "--junit", "junit.xml")
    assert code == 1, out
    assert "SCENARIO" not in out  # not a hash mismatch: a real regression
    lines = [ln for ln in out.splitlines() if ln.startswith("REGRESSED s.yaml: p99_ttft_ms: ")]
    assert len(lines) == 1, out
    assert f"p99_ttft_ms: {_fmt(base['p99_ttft_ms'])} -> " in lines[0]  # baseline mean ± 95% CI
    failures = ET.parse(work / "junit.xml").getroot().findall(".//failure")
    assert any("s.yaml: p99_ttft_ms:" in f.get("message") for f in failures)


def test_changed_scenario_is_explained_and_fails(work, capsys, monkeypatch):
    old = json.loads((work / "base.json").read_text())["scenarios"]["s.yaml"]["scenario_hash"]
    (work / "s.yaml").write_text(SCENARIO.replace("{name: continuous}", "{name: continuous, max_num_seqs: 4}"))
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json")
    assert code == 1
    assert f"SCENARIO s.yaml: scenario inputs changed since the baseline was recorded (changed: scenario): hash {old} -> sha256:" in out
    assert "REGRESSED s.yaml: median_ttft_ms" in out  # the diffs are still shown
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json", "--update")
    assert code == 0 and "baseline base.json updated" in out
    assert cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json")[0] == 0


def test_improvement_exits_0_and_is_reported(work, capsys, monkeypatch):
    doc = json.loads((work / "base.json").read_text())
    metrics = doc["scenarios"]["s.yaml"]["metrics"]
    metrics["p99_e2el_ms"] = [v * 1.5 for v in metrics["p99_e2el_ms"]]  # the baseline was worse than today
    (work / "base.json").write_text(json.dumps(doc))
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json",
                       "--markdown", "summary.md", "--changes")
    assert code == 0, out
    assert "IMPROVED s.yaml: p99_e2el_ms: " in out and "1 improvement(s)" in out
    md = (work / "summary.md").read_text()
    assert "`p99_e2el_ms`" in md.split("### Improvements")[1]


def test_bad_input_exits_2(work, capsys, monkeypatch):
    code, _, err = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "none.json")
    assert code == 2 and "baseline file not found" in err and "--update" in err
    (work / "p.yaml").write_text(SCENARIO.replace("{name: continuous}", "{name: no_such_policy}"))
    code, _, err = cli(capsys, monkeypatch, "regress", "p.yaml", "--baseline", "base.json")
    assert code == 2 and "unknown policy 'no_such_policy'" in err
    code, _, err = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json", "--rtol", "-1")
    assert code == 2


def _fmt(values: list[float]) -> str:
    """A baseline's per-seed values as the gate prints them: mean ± 95% CI."""
    from batchsim.reports.regression import fmt_ci
    from batchsim.reports.stats import mean_ci

    return fmt_ci(*mean_ci(values), len(values))


def test_an_empty_measured_window_fails_the_gate(tmp_path, capsys, monkeypatch):
    """0 measured requests used to record 0.0 ms latencies and then pass forever."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SCENARIO + "measure: {warmup_s: 100000}\n")
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json", "--update")
    assert code == 0 and "accepted by --update: not evaluable in this run" in out, out
    assert json.loads((tmp_path / "base.json").read_text())["scenarios"]["s.yaml"]["metrics"]["p99_ttft_ms"] == [None] * 5
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json")
    assert code == 1, out
    assert "SCENARIO s.yaml: not evaluable in this run: only 0 requests completed in the measured window" in out
    assert "NOT EVALUABLE s.yaml: p99_ttft_ms: null in the baseline and this run" in out
    assert "OK" not in out.splitlines()[-1] and "FAILED" in out.splitlines()[-1]


# ------------------------------------------------- the statistical gate (seeds)

# Low load, narrow prompts: seed-to-seed noise in median TTFT is a few percent,
# so the default 5-seed intervals can resolve a 10% move (at the knee, as in
# SCENARIO, they are ±10-15% wide and only larger moves show).
QUIET = (SCENARIO.replace("rate: 12.0", "rate: 2.0").replace("p90: 2500, max: 8000", "p90: 1200, max: 4000"))


@pytest.fixture(scope="module")
def quiet(tmp_path_factory):
    """The quiet scenario and a baseline recorded from it at the default seeds."""
    from batchsim.app.regress import DEFAULT_SEEDS, regress

    d = tmp_path_factory.mktemp("quiet")
    (d / "q.yaml").write_text(QUIET)
    rep = regress([d / "q.yaml"], d / "base.json", update=True)
    assert rep.exit_code == 0 and rep.seeds == DEFAULT_SEEDS
    return d


def test_neutral_change_other_seeds_passes(quiet):
    """A change that only reshuffles the randomness (here: every seed shifted by 50)
    moves each metric by noise; the intervals overlap, so the gate passes."""
    from batchsim.app.compare import with_seed
    from batchsim.app.regress import _default_runner, regress

    def reshuffled(scenario, base_dir):
        return _default_runner(with_seed(scenario, 50), base_dir)

    rep = regress([quiet / "q.yaml"], quiet / "base.json", runner=reshuffled)
    moved = [d for d in rep.scenarios[0].diffs if d.baseline != d.current]
    assert moved, "the shifted seeds should move the numbers"
    assert rep.exit_code == 0, [d.describe() for _, d in rep.rows("regressed", "improved", "changed")]


def test_ten_percent_slower_cost_model_fails_on_ttft(quiet, monkeypatch):
    """Every operator 10% slower (bandwidth and peak FLOP/s / 1.1, same scenario file
    and hash): median TTFT's new interval lies beyond the baseline's, a regression."""
    import batchsim.app.runner as runner_mod
    from batchsim.app.regress import regress

    real = runner_mod.load_hardware

    def slower(name):
        hw = real(name)
        return hw.model_copy(update={"hbm_bandwidth_gbs": hw.hbm_bandwidth_gbs / 1.1,
                                     "peak_tflops": {k: v / 1.1 for k, v in hw.peak_tflops.items()}})

    monkeypatch.setattr(runner_mod, "load_hardware", slower)
    rep = regress([quiet / "q.yaml"], quiet / "base.json")
    assert rep.exit_code == 1 and not rep.scenarios[0].problems  # not a hash mismatch
    bad = {d.metric: d for _, d in rep.rows("regressed")}
    assert "median_ttft_ms" in bad, [d.describe() for d in rep.scenarios[0].diffs]
    d = bad["median_ttft_ms"]
    assert d.current - d.current_ci > d.baseline + d.baseline_ci + d.tolerance  # the interval rule
    assert " ± " in d.describe().split(" -> ")[0] and " ± " in d.describe().split(" -> ")[1]


def test_seeds_option_is_recorded_and_checked(work, capsys, monkeypatch):
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "b2.json", "--update",
                       "--seeds", "2")
    assert code == 0, out
    entry = json.loads((work / "b2.json").read_text())["scenarios"]["s.yaml"]
    assert entry["seeds"] == [5, 6] and len(entry["metrics"]["p99_ttft_ms"]) == 2
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "b2.json", "--seeds", "3")
    assert "baseline seeds 5,6, this run 5..7: not paired seed by seed" in out
    code, _, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "b2.json", "--seeds", "0")
    assert code == 2


def test_cli_default_seeds_match_the_library():
    from batchsim.app.commands.regress import DEFAULT_SEEDS as cli_default
    from batchsim.app.regress import DEFAULT_SEEDS

    assert cli_default == DEFAULT_SEEDS == 5


@pytest.mark.parametrize("policy, needle", [
    ("{name: continuous, max_num_seqs: -3}", "p.yaml: policy.max_num_seqs: got -3"),
    ("{name: continuous, bogus: 1}", "p.yaml: policy.bogus: unknown knob for policy 'continuous'"),
    ("{name: continuous, prefill_mode: sideways}", "p.yaml: policy.prefill_mode: got 'sideways'"),
])
def test_bad_policy_knob_is_run_s_error_exit_2(work, capsys, monkeypatch, policy, needle):
    """A bad knob crashed regress with a pydantic traceback (exit 1): now it is the error
    `batchsim run` prints for the same file, naming the file and the field, exit 2."""
    (work / "p.yaml").write_text(SCENARIO.replace("{name: continuous}", policy))
    code, out, err = cli(capsys, monkeypatch, "regress", "p.yaml", "--baseline", "base.json")
    assert code == 2 and needle in err and "Traceback" not in out + err, out + err
    run_code, _, run_err = cli(capsys, monkeypatch, "run", "p.yaml", "--out", "r")
    assert run_code == 2 and run_err == err  # the same validation, the same words
