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

from batchsim.app.regress import DEFAULT_SEEDS
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
    # the baseline's mean, then the paired difference the decision used, with its interval
    assert f"p99_ttft_ms: {_fmt(base['p99_ttft_ms'])} -> " in lines[0] and f"(paired, {DEFAULT_SEEDS} seeds)" in lines[0]
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
    """A baseline's per-seed values as the gate prints them when paired: their mean."""
    from batchsim.reports.regression import fmt
    from batchsim.reports.stats import mean_ci

    return fmt(mean_ci(values)[0])


def test_an_empty_measured_window_fails_the_gate(tmp_path, capsys, monkeypatch):
    """0 measured requests used to record 0.0 ms latencies and then pass forever."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SCENARIO + "measure: {warmup_s: 100000}\n")
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json", "--update")
    assert code == 0 and "accepted by --update: not evaluable in this run" in out, out
    assert json.loads((tmp_path / "base.json").read_text())["scenarios"]["s.yaml"]["metrics"]["p99_ttft_ms"] == [None] * DEFAULT_SEEDS
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


NEUTRAL_OFFSETS = range(50, 501, 50)


@pytest.mark.parametrize("offset", NEUTRAL_OFFSETS)
def test_neutral_change_other_seeds_passes(quiet, offset):
    """A change that only reshuffles the randomness (every seed shifted by ``offset``)
    moves each metric by noise only, so the gate passes, at every offset."""
    from batchsim.app.compare import with_seed
    from batchsim.app.regress import _default_runner, regress

    def reshuffled(scenario, base_dir):
        return _default_runner(with_seed(scenario, offset), base_dir)

    rep = regress([quiet / "q.yaml"], quiet / "base.json", runner=reshuffled)
    moved = [d for d in rep.scenarios[0].diffs if d.baseline != d.current]
    assert moved, "the shifted seeds should move the numbers"
    assert rep.exit_code == 0, [d.describe() for _, d in rep.rows("regressed", "improved", "changed")]


@pytest.mark.slow
def test_neutral_changes_pass_the_shipped_gate():
    """The false alarms the gate is designed against: on the shipped baselines (5 scenarios x
    13 metrics), the per-metric rule failed 5 of these 10 neutral offsets; Holm over the whole
    run keeps the family-wise rate at 5%, and none of them fails (scripts/regress_false_alarms.py)."""
    import glob

    from batchsim.app.compare import with_seed
    from batchsim.app.regress import _default_runner, regress
    from batchsim.reports.regression import FAILING

    root = Path(__file__).resolve().parents[1]
    failing = {}
    for offset in NEUTRAL_OFFSETS:
        rep = regress(sorted(glob.glob(str(root / "baselines" / "*.yaml"))), root / "baselines" / "baseline.json",
                      runner=lambda sc, bd, k=offset: _default_runner(with_seed(sc, k), bd))
        assert rep.family == 65
        if rep.exit_code:
            failing[offset] = [f"{s.key}: {d.describe()}" for s, d in rep.rows(*FAILING)]
    assert not failing, failing


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
    assert d.rule == "paired t" and d.p_adj <= 0.05
    assert d.delta - d.delta_ci > d.tolerance  # (implied: the one-sided test at 0.05/13 is stricter)
    assert f"Δ +{d.delta_text.split('+')[1]}" in d.describe() and f"(paired, {DEFAULT_SEEDS} seeds)" in d.describe()


def test_seeds_option_is_recorded_and_checked(work, capsys, monkeypatch):
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "b2.json", "--update",
                       "--seeds", "2")
    assert code == 0, out
    entry = json.loads((work / "b2.json").read_text())["scenarios"]["s.yaml"]
    assert entry["seeds"] == [5, 6] and len(entry["metrics"]["p99_ttft_ms"]) == 2
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "b2.json", "--seeds", "3")
    assert "baseline seeds 5,6, this run 5..7: paired on the 2 seeds both hold (5,6)" in out
    code, _, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "b2.json", "--seeds", "0")
    assert code == 2


def test_cli_default_seeds_match_the_library():
    from batchsim.app.commands.regress import DEFAULT_SEEDS as cli_default
    from batchsim.app.regress import DEFAULT_SEEDS

    assert cli_default == DEFAULT_SEEDS == 10


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


def test_output_paths_are_checked_before_the_work(work, capsys, monkeypatch):
    """--markdown naming a folder used to write the baseline (--update) and the JUnit file first,
    then exit 2 naming a temp file: now nothing runs and nothing is written."""
    (work / "adir").mkdir()
    before = (work / "base.json").read_bytes()
    ran = []
    import batchsim.app.regress as regress_mod

    monkeypatch.setattr(regress_mod, "_run_one", lambda *a: ran.append(a))
    for option, path in (("--markdown", "adir"), ("--junit", "adir"), ("--markdown", "base.json/x.md")):
        args = ["--junit", "j.xml", "--markdown", "m.md"]
        args[args.index(option) + 1] = path
        code, out, err = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json", "--update", *args)
        assert code == 2 and err.startswith(f"error: {option}: "), err
        assert not ran and not (work / "j.xml").exists() and not (work / "m.md").exists()
        assert (work / "base.json").read_bytes() == before
    code, _, err = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json", "--junit", "x",
                       "--markdown", "x")
    assert code == 2 and "--markdown: x is also given as --junit" in err


def test_outputs_are_written_as_one_set(work, capsys, monkeypatch):
    """A failure while writing leaves every old output as it was, never some new beside old."""
    import batchsim.reports.regression as regression

    (work / "out").mkdir()
    (work / "out" / "j.xml").write_text("old")
    before = (work / "base.json").read_bytes()

    def boom(report):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(regression, "to_markdown", boom)
    code, _, err = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json", "--update",
                       "--junit", "out/j.xml", "--markdown", "out/m.md")
    assert code == 2 and "No space left" in err
    assert (work / "out" / "j.xml").read_text() == "old" and (work / "base.json").read_bytes() == before
    assert sorted(p.name for p in (work / "out").iterdir()) == ["j.xml"]


def test_malformed_baseline_value_exits_2(work, capsys, monkeypatch):
    doc = json.loads((work / "base.json").read_text())
    doc["scenarios"]["s.yaml"]["metrics"]["completed"] = "400"
    (work / "base.json").write_text(json.dumps(doc))
    code, _, err = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json")
    assert code == 2 and 'base.json: scenarios["s.yaml"].metrics.completed: got \'400\'' in err


@pytest.mark.parametrize("args, needle", [
    (["--metrics", "policy"], "--metrics: not a numeric summary key 'policy'"),
    (["--metrics", ","], "--metrics: got ','"),
    (["--rtol", "inf"], "--rtol: got inf"),
    (["--rtol", "nan"], "--rtol: got nan"),
])
def test_bad_options_exit_2(work, capsys, monkeypatch, args, needle):
    code, _, err = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json", *args)
    assert code == 2 and needle in err, err


def test_the_reproduce_command_gives_the_same_verdict(work, capsys, monkeypatch):
    import shlex

    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "base.json", "--rtol", "0.05",
                       "--metrics", "p99_ttft_ms,completed", "--junit", "j.xml")
    props = {p.get("name"): p.get("value") for p in ET.parse(work / "j.xml").getroot().iter("property")}
    cmd = shlex.split(props["reproduce"])
    assert cmd[:2] == ["batchsim", "regress"] and "--rtol" in cmd and "p99_ttft_ms,completed" in cmd
    assert props["model"] == "llama-3-8b" and props["hardware"] == "h100-sxm" and props["engine"] in ("core", "python")
    code2, out2, _ = cli(capsys, monkeypatch, *cmd[1:])
    table = [ln for ln in out.splitlines() if "│" in ln]
    assert code2 == code and table == [ln for ln in out2.splitlines() if "│" in ln]
    assert f"reproduce: {props['reproduce']}" in out
    run = shlex.split(props["run_seed_0"])
    assert run == ["batchsim", "run", "s.yaml", "--set", "seed=5"]


def test_a_one_seed_baseline_and_the_default_seeds_pass_unchanged_code(work, capsys, monkeypatch):
    """The example CI workflow's case: a baseline recorded with --seeds 1, a run at the default 5
    seeds. It failed unchanged code (a 5-seed interval against a zero-width one); now the seed
    both hold is compared exactly, and the output says so."""
    assert cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "b1.json", "--update", "--seeds", "1")[0] == 0
    code, out, _ = cli(capsys, monkeypatch, "regress", "s.yaml", "--baseline", "b1.json")
    assert code == 0, out
    assert "compared on the one seed both hold (5), exactly" in out


def test_write_files_puts_nothing_in_place_when_one_fails(tmp_path):
    from batchsim.sim.io import write_files

    (tmp_path / "a.txt").write_text("old")
    (tmp_path / "f").write_text("a file, not a folder")
    with pytest.raises(OSError):
        write_files({tmp_path / "a.txt": b"new", tmp_path / "f" / "b.txt": b"new"})
    assert (tmp_path / "a.txt").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "f"]
