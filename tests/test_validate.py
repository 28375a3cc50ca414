"""``batchsim calibrate`` and ``batchsim validate`` end to end on the CPU with the tiny model (CI).

The quick test runs what CI runs, with a small workload and loose tolerances:
on a shared machine timing noise alone can move a p99 by 25%, and the gate
being tested here is the machinery, not the machine. The slow test runs the
documented check (60 requests, the default tolerances); run it with
``BATCHSIM_SLOW=1 pytest -m slow``.
"""

from __future__ import annotations

import json
import math
import os

import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from batchsim.calibrate.hardware import load_hardware  # noqa: E402
from batchsim.app.cli import app  # noqa: E402
from tests.test_cli_run import batchsim  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "cpu-quick.yaml"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--quick", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "held-out kernel error" in res.output
    return out


def test_calibrate_quick_writes_a_calibrated_profile_with_provenance(profile):
    hw = load_hardware(str(profile))
    assert hw.calibrated and set(hw.efficiency) >= {"gemm", "attention_prefill", "attention_decode", "elementwise",
                                                    "norms", "rotary", "kv_cache_write", "mlp_act", "embedding"}
    cal = hw.provenance["calibration"]
    assert cal["models"] == ["tiny-llama"] and cal["quick"] is True and "torch" in cal["software"]
    assert "measured" in hw.provenance["peak_tflops"] and "measured" in hw.provenance["hbm_bandwidth"]
    held = cal["held_out_error"]
    assert held["overall"]["n"] > 100 and held["overall"]["median"] < 0.5
    assert hw.launch_latency_us > 0 and all(e.measured_range for e in hw.efficiency.values())


def test_validate_writes_json_csv_plot_and_records(profile, tmp_path):
    out = tmp_path / "val"
    res = runner.invoke(app, ["validate", "--device", "cpu", "--profile", str(profile), "--out", str(out),
                              "--requests", "24", "--rate", "10", "--p50-tol", "0.6", "--p99-tol", "1.5"])
    assert res.exit_code in (0, 1) and not isinstance(res.exception, Exception), (res.output, res.exception)
    data = json.loads((out / "validate.json").read_text())
    assert data["meta"]["model"] == "tiny-llama" and set(data["steps"]) == {
        "static", "dynamic", "continuous", "chunked_prefill"}
    assert len(data["metrics"]) == 4 * 3 * 2
    for row in data["metrics"]:
        assert row["measured_ms"] > 0 and row["simulated_ms"] > 0 and math.isfinite(row["rel_error"])
    assert (out / "validate.csv").read_text().startswith("policy,metric,percentile,measured_ms")
    assert (out / "validate.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "continuous" / "executor_requests.csv").exists()
    assert (out / "static" / "simulator_requests.csv").exists()
    assert res.exit_code == (0 if data["passed"] else 1)


def test_validate_exits_one_past_the_tolerance(profile, tmp_path):
    res = runner.invoke(app, ["validate", "--profile", str(profile), "--out", str(tmp_path), "--policies",
                              "continuous", "--requests", "6", "--p50-tol", "0", "--p99-tol", "0"])
    assert res.exit_code == 1 and "FAILED" in res.output


def test_validate_rejects_unknown_policies_and_devices(profile, tmp_path):
    from batchsim.sim.errors import InputError

    from batchsim.app.validate import validate

    with pytest.raises(InputError, match="unknown policies"):
        validate("cpu", profile, policies=["fifo"])
    with pytest.raises(InputError, match="--device"):
        validate("tpu", profile)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("BATCHSIM_SLOW"), reason="set BATCHSIM_SLOW=1 to run the documented check")
def test_documented_cpu_validation_meets_its_tolerances(tmp_path):
    prof = tmp_path / "cpu.yaml"
    assert runner.invoke(app, ["calibrate", "--out", str(prof)]).exit_code == 0
    res = runner.invoke(app, ["validate", "--profile", str(prof), "--out", str(tmp_path / "val"), "--repeats", "3"])
    assert res.exit_code == 0, res.output


@pytest.fixture(scope="module")
def evidence(tmp_path_factory):
    """A quick calibration's profile and the evidence folder behind it."""
    tmp = tmp_path_factory.mktemp("ev")
    prof, ev = tmp / "p.yaml", tmp / "ev"
    res = runner.invoke(app, ["calibrate", "--quick", "--rounds", "2", "--out", str(prof), "--evidence", str(ev)])
    assert res.exit_code == 0, res.output
    return prof, ev


def test_refit_from_evidence_reproduces_the_profile(evidence, tmp_path):
    """--evidence writes what a fit needs; --refit fits it again without a device."""
    prof, ev = evidence
    assert {p.name for p in ev.iterdir()} == {"kernels.csv", "steps.csv", "facts.json"}
    facts = json.loads((ev / "facts.json").read_text())
    assert facts["kind"] == "cpu" and facts["launch_on"] == "host" and facts["models"] == ["tiny-llama"]
    res = runner.invoke(app, ["calibrate", "--refit", str(ev), "--out", str(tmp_path / "q.yaml")])
    assert res.exit_code == 0, res.output
    a, b = load_hardware(str(prof)), load_hardware(str(tmp_path / "q.yaml"))
    assert a.name == b.name and a.launch_latency_us == b.launch_latency_us
    assert a.peak_tflops == pytest.approx(b.peak_tflops, rel=1e-6)
    assert a.host_overhead.per_step_us == pytest.approx(b.host_overhead.per_step_us, rel=1e-4, abs=0.02)
    assert a.efficiency == b.efficiency  # (evidence keeps every digit: the same fit)


@pytest.mark.parametrize("edit, message", [
    (("facts.json", '"quick": true', '"quick": false'), "another plan"),
    (("facts.json", '"kind": "cpu"', '"kind": "tpu"'), "kind/quick must be one of"),
    (("facts.json", '"tiny-llama"', '"no-such-model"'), "no-such-model"),
    (("steps.csv", "\n0,", "\n9999,"), "not in the cpu calibration plan"),
    (("kernels.csv", ",tiny-llama,", ",tiny-llama,"), None),
])
def test_refit_rejects_evidence_that_does_not_match(evidence, tmp_path, edit, message):
    import shutil

    ev = tmp_path / "ev"
    shutil.copytree(evidence[1], ev)
    name, old, new = edit
    text = (ev / name).read_text()
    assert old in text or name == "kernels.csv"
    (ev / name).write_text(text.replace(old, new, 1))
    res = batchsim("calibrate", "--refit", str(ev), "--out", str(tmp_path / "p.yaml"))
    if message is None:
        assert res.returncode == 0, res.stderr
    else:
        assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_refit_names_the_bad_value_and_line(evidence, tmp_path):
    import shutil

    ev = tmp_path / "ev"
    shutil.copytree(evidence[1], ev)
    lines = (ev / "kernels.csv").read_text().splitlines()
    lines[3] = ",".join(lines[3].split(",")[:-1] + ["0"])  # a kernel that took no time
    (ev / "kernels.csv").write_text("\n".join(lines) + "\n")
    res = batchsim("calibrate", "--refit", str(ev), "--out", str(tmp_path / "p.yaml"))
    assert res.returncode == 2 and "kernels.csv:4" in res.stderr and "seconds must be" in res.stderr, res.stderr
    (ev / "kernels.csv").write_text(lines[0] + "\n")  # a header and no rows
    res = batchsim("calibrate", "--refit", str(ev), "--out", str(tmp_path / "p.yaml"))
    assert res.returncode == 2 and "no rows" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_refit_names_what_is_missing(tmp_path):
    (tmp_path / "kernels.csv").write_text("model\n")
    res = batchsim("calibrate", "--refit", str(tmp_path), "--out", str(tmp_path / "p.yaml"))
    assert res.returncode == 2 and "no steps.csv" in res.stderr and "Traceback" not in res.stderr


def test_replay_compares_a_profile_with_recorded_executor_runs(profile, tmp_path):
    """Replaying a validation with its own profile gives back its simulated numbers exactly."""
    out = tmp_path / "val"
    res = runner.invoke(app, ["validate", "--profile", str(profile), "--out", str(out), "--policies",
                              "continuous,static", "--requests", "8", "--rate", "10", "--step-repeats", "1"])
    assert res.exit_code in (0, 1), res.output
    times = (out / "continuous" / "executor_step_times.csv").read_text().splitlines()
    assert times[0] == "measured_s,predicted_s,rows,tokens,enqueue_s,wall_s,cpu_s,at_ms,mode" and len(times) > 8
    res = runner.invoke(app, ["validate", "--replay", str(out), "--profile", str(profile), "--out", str(tmp_path / "r")])
    assert res.exit_code in (0, 1), res.output
    first, again = (json.loads((d / "validate.json").read_text()) for d in (out, tmp_path / "r"))
    assert again["meta"]["replayed_from"] == str(out) and again["steps"] == {}
    key = lambda r: (r["policy"], r["metric"], r["percentile"])  # noqa: E731
    assert sorted(map(key, again["metrics"])) == sorted(map(key, first["metrics"]))
    for r1, r2 in zip(sorted(first["metrics"], key=key), sorted(again["metrics"], key=key)):
        assert r2["simulated_ms"] == r1["simulated_ms"]
        assert r2["measured_ms"] == pytest.approx(r1["measured_ms"], rel=1e-6)
    res = batchsim("validate", "--replay", str(tmp_path), "--profile", str(profile), "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "not a validate output folder" in res.stderr and "Traceback" not in res.stderr
    res = batchsim("validate", "--replay", str(out), "--profile", str(profile), "--out", str(out))
    assert res.returncode == 2 and "--out must differ" in res.stderr
    # a leftover of an earlier run into the same folder is not one of the recorded runs
    (out / "static" / "executor_requests_1.csv").write_text("rid,status,ttft,tpot,e2el\n0,completed,9,9,9\n")
    res = runner.invoke(app, ["validate", "--replay", str(out), "--profile", str(profile), "--out", str(tmp_path / "s")])
    stale = json.loads((tmp_path / "s" / "validate.json").read_text())
    assert [r["measured_ms"] for r in stale["metrics"]] == [r["measured_ms"] for r in again["metrics"]]
    (out / "static" / "executor_requests.csv").write_text("rid\n")
    res = batchsim("validate", "--replay", str(out), "--profile", str(profile), "--out", str(tmp_path / "t"))
    assert res.returncode == 2 and "missing columns" in res.stderr and "Traceback" not in res.stderr
