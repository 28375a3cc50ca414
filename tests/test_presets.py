"""Engine presets (batchsim/engines/): sourced defaults, resolved per deployment, user keys win."""

from __future__ import annotations

import pytest

from batchsim import policies
from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_parts, simulate
from batchsim.engines import PRESETS, load_preset, preset_report
from batchsim.sim.errors import InputError


def _raw(preset: str, **over) -> dict:
    raw = {"name": "p", "model": "llama-3-8b", "hardware": "h100-sxm", "engine_preset": preset,
           "workload": {"num_requests": 50, "arrival": {"process": "poisson", "rate": 4.0},
                        "prompt_tokens": {"dist": "fixed", "value": 300},
                        "output_tokens": {"dist": "fixed", "value": 30}}}
    raw.update(over)
    return raw


def test_the_four_engines_ship_and_every_knob_names_its_source():
    assert set(PRESETS) == {"vllm-v1", "vllm-v0", "sglang", "trtllm"}
    for name in PRESETS:
        p = load_preset(name)
        assert p.version and p.engine
        for key, knob in p.policy.items():
            assert len(knob.source) > 20, (name, key)


@pytest.mark.parametrize("name", ["vllm-v1", "vllm-v0", "sglang", "trtllm"])
def test_each_preset_resolves_to_a_valid_policy_and_runs(name):
    sc = scenario_from_dict(_raw(name))
    policies.create_policy(sc.policy)  # every value is one its policy accepts
    r = simulate(sc, build_parts(sc))
    assert (r.requests["status"] == "completed").all()
    rep = r.summary["engine_preset"]
    assert rep["name"] == name and rep["notes"]
    assert r.summary["provenance"]["engine_preset"] == name


@pytest.mark.parametrize("hardware,seqs,tokens", [("h100-sxm", 1024, 8192), ("h200", 1024, 8192),
                                                  ("a100-80gb", 256, 2048), ("l4", 256, 2048)])
def test_vllm_v1_limits_follow_the_device_as_get_batch_defaults_does(hardware, seqs, tokens):
    sc = scenario_from_dict(_raw("vllm-v1", hardware=hardware))
    assert (sc.policy["max_num_seqs"], sc.policy["max_num_batched_tokens"]) == (seqs, tokens)
    assert sc.policy["name"] == "chunked_prefill" and sc.policy["admission"] == "sequence"
    assert sc.policy["gpu_memory_utilization"] == 0.92


def test_vllm_v0_budget_is_the_context_length_at_least_2048():
    sc = scenario_from_dict(_raw("vllm-v0"))
    assert sc.policy["max_num_batched_tokens"] == 8192  # llama-3-8b's 8192-token context
    sc = scenario_from_dict(_raw("vllm-v0", policy={"name": "continuous", "max_model_len": 1024}))
    assert sc.policy["max_num_batched_tokens"] == 2048


def test_the_scenarios_own_keys_win_and_the_report_says_whose_each_value_is():
    sc = scenario_from_dict(_raw("vllm-v1", policy={"name": "chunked_prefill", "max_num_seqs": 64}))
    assert sc.policy["max_num_seqs"] == 64 and sc.policy["max_num_batched_tokens"] == 8192
    knobs = preset_report(sc)["knobs"]
    assert knobs["max_num_seqs"]["from"] == "scenario" and knobs["max_num_seqs"]["preset_value"] == 1024
    assert knobs["max_num_batched_tokens"]["from"] == "preset"


def test_a_knob_the_chosen_policy_lacks_is_left_out_and_said():
    sc = scenario_from_dict(_raw("vllm-v1", policy={"name": "static", "max_batch_size": 8}))
    assert "max_num_seqs" not in sc.policy and sc.policy["block_size"] == 16
    knobs = preset_report(sc)["knobs"]
    assert knobs["max_num_seqs"]["from"].startswith("left out")


def test_prefix_caching_is_on_only_for_a_workload_with_shared_prefixes():
    sc = scenario_from_dict(_raw("vllm-v1"))
    assert "enable_prefix_caching" not in sc.policy
    wl = dict(_raw("vllm-v1")["workload"], shared_prefix={"groups": 4, "tokens": 128, "block_tokens": 16})
    sc = scenario_from_dict(_raw("vllm-v1", workload=wl))
    assert sc.policy["enable_prefix_caching"] is True
    r = simulate(sc, build_parts(sc))
    assert r.summary["prefix_cache_hit_rate"] > 0


def test_trtllm_reserves_to_completion_so_a_saturated_run_never_preempts():
    wl = {"num_requests": 400, "arrival": {"process": "poisson", "rate": 200.0},
          "prompt_tokens": {"dist": "fixed", "value": 2000}, "output_tokens": {"dist": "fixed", "value": 1500}}
    small = {"gpu_memory_utilization": 0.9}
    trt = scenario_from_dict(_raw("trtllm", workload=wl, hardware="l4"))
    v0 = scenario_from_dict(_raw("vllm-v0", workload=wl, hardware="l4", policy={"name": "continuous", **small}))
    r_trt, r_v0 = (simulate(s, build_parts(s)) for s in (trt, v0))
    assert r_v0.summary["preemptions"] > 0
    assert r_trt.summary["preemptions"] == 0


def test_free_memory_fraction_sizes_kv_from_what_weights_leave():
    sc = scenario_from_dict(_raw("trtllm"))
    parts = build_parts(sc)
    free = parts.kv_tokens(0.9, memory_of="free")
    total = parts.kv_tokens(0.9)
    assert free > total  # 0.9 of what is left after the weights, against 0.9 of all memory less the weights


def test_an_unknown_preset_is_a_one_line_error():
    with pytest.raises(InputError, match="engine_preset.*vllm-v1"):
        scenario_from_dict(_raw("vllm-v2"))


def test_a_policy_section_without_a_name_takes_the_presets():
    sc = scenario_from_dict(_raw("vllm-v1", policy={"max_num_seqs": 256}))
    assert sc.policy["name"] == "chunked_prefill" and sc.policy["max_num_seqs"] == 256


def test_a_changed_device_or_preset_resolves_the_presets_keys_again():
    from batchsim.app.compare import scenario_data, with_policy

    sc = scenario_from_dict(_raw("vllm-v1", policy={"max_num_seqs": 512}))
    assert sc.policy["max_num_batched_tokens"] == 8192
    data = scenario_data(sc)
    data["hardware"] = "a100-80gb"  # (what plan's grid and run --set hardware=... do)
    again = scenario_from_dict(data)
    assert again.policy["max_num_batched_tokens"] == 2048 and again.policy["max_num_seqs"] == 512
    data = scenario_data(sc)
    data["engine_preset"] = "trtllm"
    trt = scenario_from_dict(data)
    assert trt.policy["name"] == "continuous" and trt.policy["admission"] == "completion"
    assert trt.policy["max_num_seqs"] == 512  # (the scenario's own key)
    data["engine_preset"] = None
    plain = scenario_from_dict(data)
    assert plain.policy == {"name": "continuous", "max_num_seqs": 512}
    # a compare's swap keeps the KV knobs, resolved for the swapped-in policy
    static = with_policy(scenario_from_dict(_raw("trtllm")), "static")
    assert static.policy["name"] == "static" and static.policy["gpu_memory_utilization_of"] == "free"
    assert static.policy["block_size"] == 32


def test_vllm_v0_turns_chunked_prefill_on_past_a_32k_context():
    sc = scenario_from_dict(_raw("vllm-v0", model="llama-3.1-8b"))
    assert (sc.policy["name"], sc.policy["max_num_batched_tokens"], sc.policy["prefill_mode"]) == (
        "chunked_prefill", 2048, "mixed")


def test_jobs_that_set_a_preset_filled_knob_keep_their_value():
    from batchsim.app.capacity.grid import build_configs
    from batchsim.app.compare import with_policy
    from batchsim.app.config import apply_overrides

    raw = _raw("vllm-v1", policy_knobs={"static": {"block_size": 32}})
    sc = scenario_from_dict(raw)
    assert with_policy(sc, "static").policy["block_size"] == 32  # (policy_knobs win over the preset)
    assert scenario_from_dict(apply_overrides(dict(raw), ["policy.max_num_seqs=8"])).policy["name"] == "chunked_prefill"
    configs = build_configs(sc, hardware=["h100-sxm", "a100-80gb"], knobs=[("policy.max_num_batched_tokens", [4096])])
    for c in configs:
        assert c.scenario["policy"]["max_num_batched_tokens"] == 4096
    by_hw = {c.hardware: scenario_from_dict(c.scenario).policy["max_num_seqs"] for c in configs}
    assert by_hw == {"h100-sxm": 1024, "a100-80gb": 256}


def test_vllm_v0s_context_rule_follows_the_chosen_policy():
    sc = scenario_from_dict(_raw("vllm-v0", model="llama-3.1-8b", policy={"name": "continuous"}))
    assert (sc.policy["max_num_batched_tokens"], sc.policy["prefill_mode"]) == (131072, "separate")


def test_the_presets_record_is_not_part_of_the_scenarios_hashes(tmp_path):
    from batchsim.app.regress import scenario_inputs

    a = scenario_from_dict(_raw("vllm-v1"))
    b = a.model_copy(update={"engine_preset_values": {}})
    assert scenario_inputs(a, tmp_path) == scenario_inputs(b, tmp_path)
