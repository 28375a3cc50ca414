"""The model catalog and the hardware profiles: loading, validation, provenance."""

from __future__ import annotations

import json

import pytest
import yaml

from batchsim.calibrate.default_curves import DEVICE_PARAMS, default_efficiency, gemm_shape
from batchsim.calibrate.hardware import OP_CLASSES, HardwareProfile, hardware_names, load_hardware, save_hardware
from batchsim.calibrate.models import ModelSpec, load_model, model_names, param_count, weight_params
from batchsim.sim.errors import InputError

# Published parameter counts (model cards / papers), in billions.
PUBLISHED_PARAMS = {
    "llama-2-7b": 6.74, "llama-2-13b": 13.02, "llama-2-70b": 68.98, "llama-3-8b": 8.03,
    "llama-3-70b": 70.55, "llama-3.1-405b": 405.85, "mistral-7b": 7.25, "mixtral-8x7b": 46.70,
    "qwen2.5-7b": 7.62, "qwen2.5-72b": 72.71, "yi-34b": 34.39,
    "llama-3.1-8b": 8.03, "llama-3.1-70b": 70.55,
    "bloom-176b": 176.25,  # (bigscience/bloom model card: 176,247,271,424)
}
REQUIRED_HARDWARE = {"a100-40gb", "a100-80gb", "a100-80gb-pcie", "h100-sxm", "h100-pcie", "h200",
                     "b200", "l4", "l40s", "mi300x"}


def test_catalog_lists_every_required_model():
    assert set(PUBLISHED_PARAMS) <= set(model_names())


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_catalog_parameter_counts_match_published(name):
    assert param_count(load_model(name)) / 1e9 == pytest.approx(PUBLISHED_PARAMS[name], rel=0.005)


def test_derived_fields_follow_hf_semantics():
    m = ModelSpec(name="x", hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                  intermediate_size=128, vocab_size=100, max_position_embeddings=512)
    assert m.num_key_value_heads == 8 and m.head_dim == 8 and m.mlp_gated and not m.is_moe
    assert ModelSpec(name="g", model_type="gpt_neox", hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                     intermediate_size=128, vocab_size=100, max_position_embeddings=512).mlp_gated is False


def test_mixtral_is_moe_and_tied_embeddings_counted_once():
    mix = load_model("mixtral-8x7b")
    assert mix.is_moe and mix.num_local_experts == 8 and mix.num_experts_per_tok == 2
    tied = ModelSpec(name="t", hidden_size=64, num_hidden_layers=1, num_attention_heads=8, intermediate_size=128,
                     vocab_size=100, max_position_embeddings=512, tie_word_embeddings=True)
    assert weight_params(tied)["lm_head"] == 0


def test_hf_config_json_path_loads_ignoring_unknown_keys(tmp_path):
    cfg = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
           "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
           "intermediate_size": 5632, "moe_intermediate_size": 1408, "num_experts": 60,
           "num_experts_per_tok": 4, "vocab_size": 151936, "max_position_embeddings": 8192,
           "torch_dtype": "bfloat16", "rope_theta": 1000000.0}
    d = tmp_path / "Qwen1.5-MoE-A2.7B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    for arg in (str(d / "config.json"), str(d)):
        m = load_model(arg)
        assert m.name == "Qwen1.5-MoE-A2.7B"
        assert m.num_local_experts == 60 and m.expert_intermediate_size == 1408 and m.attention_bias


def test_unknown_model_lists_catalog_names():
    with pytest.raises(InputError) as e:
        load_model("llama-9-1b")
    assert "llama-3-8b" in str(e.value) and "mixtral-8x7b" in str(e.value)


def test_bad_field_names_file_field_and_value(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({"hidden_size": -4, "num_hidden_layers": 2, "num_attention_heads": 8,
                                 "intermediate_size": 16, "vocab_size": 10, "max_position_embeddings": 8}))
    with pytest.raises(InputError) as e:
        load_model(str(p))
    msg = str(e.value)
    assert str(p) in msg and "hidden_size" in msg and "-4" in msg


def test_missing_field_and_inconsistent_heads(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
                             "vocab_size": 10, "max_position_embeddings": 8}))
    with pytest.raises(InputError, match="intermediate_size"):
        load_model(str(p))
    p.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
                             "num_key_value_heads": 3, "intermediate_size": 16, "vocab_size": 10,
                             "max_position_embeddings": 8}))
    with pytest.raises(InputError, match="num_key_value_heads"):
        load_model(str(p))


def test_every_required_hardware_profile_is_shipped():
    assert REQUIRED_HARDWARE <= set(hardware_names())


@pytest.mark.parametrize("name", sorted(REQUIRED_HARDWARE))
def test_datasheet_profiles_are_dense_uncalibrated_and_cited(name):
    hw = load_hardware(name)
    assert not hw.calibrated
    for key in ("peak_tflops", "memory", "hbm_bandwidth", "interconnect", "efficiency", "host_overhead"):
        assert len(str(hw.provenance[key])) > 20, key
    assert set(OP_CLASSES) == set(hw.efficiency)
    # dense, not sparse: fp8 (where present) is exactly twice bf16, and no part exceeds 2.5 PFLOP/s bf16
    assert hw.peak_tflops["bf16"] <= 2500
    if "fp8" in hw.peak_tflops:
        assert hw.peak_tflops["fp8"] == pytest.approx(2 * hw.peak_tflops["bf16"], rel=0.02)


def test_known_datasheet_figures():
    h100, a100 = load_hardware("h100-sxm"), load_hardware("a100-80gb")
    assert (h100.peak_tflops["bf16"], h100.hbm_bandwidth_gbs, h100.memory_gib) == (989.4, 3350.0, 80.0)
    assert (a100.peak_tflops["bf16"], a100.hbm_bandwidth_gbs) == (312.0, 2039.0)
    assert "fp8" not in a100.peak_tflops
    assert load_hardware("mi300x").peak_tflops["bf16"] == 1307.4
    assert load_hardware("h200").hbm_bandwidth_gbs == 4800.0


@pytest.mark.parametrize("name", sorted(DEVICE_PARAMS))
def test_profile_curves_are_what_default_curves_generates(name):
    hw = load_hardware(name)
    want = default_efficiency(hw.peak_flops("bf16"), hw.bandwidth, DEVICE_PARAMS[name])
    got = {c: e.model_dump(exclude_none=True) for c, e in hw.efficiency.items()}
    assert got == {c: {k: [tuple(p) for p in v] for k, v in e.items()} for c, e in want.items()}


def test_gemm_shape_is_monotone_and_saturates():
    xs = [2**i / 64 for i in range(12)]
    ys = [gemm_shape(x) for x in xs]
    assert ys == sorted(ys) and ys[-1] == 1.0 and gemm_shape(0.01) == pytest.approx(0.01504)


def _calibrated_dict(**overrides) -> dict:
    data = load_hardware("h100-sxm").model_dump(mode="json")
    data["calibrated"] = True
    data["provenance"]["calibration"] = {"device": "NVIDIA H100 80GB HBM3", "date": "2025-01-01",
                                         "software": {"torch": "2.5.1", "cuda": "12.4", "driver": "550.54"}}
    for c in data["efficiency"]:
        data["efficiency"][c]["measured_range"] = {"tokens": [1, 4096], "bytes": [4096, 1 << 31]}
    data.update(overrides)
    return data


def test_calibrated_profile_needs_calibration_provenance_and_ranges(tmp_path):
    HardwareProfile.model_validate(_calibrated_dict())
    bad = _calibrated_dict()
    del bad["provenance"]["calibration"]
    with pytest.raises(ValueError, match="calibration"):
        HardwareProfile.model_validate(bad)
    bad = _calibrated_dict()
    bad["efficiency"]["gemm"]["measured_range"] = None
    with pytest.raises(ValueError, match="measured_range"):
        HardwareProfile.model_validate(bad)


def test_save_and_reload_round_trips(tmp_path):
    prof = HardwareProfile.model_validate(_calibrated_dict(name="h100-fitted"))
    path = save_hardware(prof, tmp_path / "h100-fitted.yaml")
    assert load_hardware(str(path)) == prof


def test_bad_curve_is_rejected_with_file_and_field(tmp_path):
    data = load_hardware("l4").model_dump(mode="json")
    data["efficiency"]["gemm"]["compute"] = [[64, 0.5], [16, 0.6]]
    p = tmp_path / "l4-bad.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as e:
        load_hardware(str(p))
    assert str(p) in str(e.value) and "efficiency.gemm.compute" in str(e.value)


def test_unknown_hardware_lists_profiles():
    with pytest.raises(InputError, match="h100-sxm"):
        load_hardware("tpu-v9")
