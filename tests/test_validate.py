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

from calibrate.hardware import load_hardware  # noqa: E402
from sim.cli import app  # noqa: E402

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
    from sim.errors import InputError

    from calibrate.validate import validate

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
