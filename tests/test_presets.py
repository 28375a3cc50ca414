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


def _small(**over) -> dict:
    wl = {"num_requests": 12, "arrival": {"process": "poisson", "rate": 4.0},
          "prompt_tokens": {"dist": "fixed", "value": 300}, "output_tokens": {"dist": "fixed", "value": 8}}
    return {"workload": wl, **over}


@pytest.mark.parametrize("old", ["sglang", "vllm-v0", "trtllm"])
def test_another_preset_drops_the_keys_the_old_one_filled_and_it_does_not_set(old):
    from batchsim.app.capacity.grid import build_configs
    from batchsim.app.compare import scenario_data

    sc = scenario_from_dict(_raw(old))
    data = scenario_data(sc)
    data["engine_preset"] = "vllm-v1"  # (what plan --knob engine_preset=... and run --set engine_preset=... do)
    fresh = scenario_from_dict(_raw("vllm-v1"))
    again = scenario_from_dict(data)
    assert again.policy == fresh.policy and again.engine_preset_values == fresh.engine_preset_values
    configs = build_configs(sc, knobs=[("engine_preset", [old, "vllm-v1"])])
    assert [scenario_from_dict(c.scenario).policy == fresh.policy for c in configs] == [False, True]
    # a key of the old preset's that the user changed since is the user's
    data = scenario_data(scenario_from_dict(_raw("vllm-v0")))
    data["policy"]["victim"] = "fewest_decoded"
    data["engine_preset"] = "vllm-v1"
    assert scenario_from_dict(data).policy["victim"] == "fewest_decoded"


def test_a_record_naming_a_key_no_preset_sets_is_an_error_naming_the_field():
    with pytest.raises(InputError, match="engine_preset_values.*bogus_knob.*no engine preset sets"):
        scenario_from_dict(_raw("vllm-v1", engine_preset_values={"bogus_knob": 1}))


def test_a_disaggregated_runs_preset_report_states_each_pools_values():
    from batchsim.app.summary_table import preset_lines

    sc = scenario_from_dict(_raw("vllm-v1", **_small(disaggregation={
        "prefill": {"replicas": 1, "hardware": "a100-80gb"}, "decode": {"replicas": 1}})))
    r = simulate(sc, build_parts(sc))
    rep = r.summary["engine_preset"]
    ran = r.summary["provenance"]["policy"]
    assert ran["prefill"]["max_num_seqs"] == 256 and ran["decode"]["max_num_seqs"] == 1024
    assert rep["knobs"]["max_num_seqs"]["value"] == {"prefill": 256, "decode": 1024}
    assert rep["knobs"]["max_num_batched_tokens"]["value"] == {"prefill": 2048, "decode": 8192}
    assert rep["knobs"]["block_size"]["value"] == 16  # (the pools agree: one value)
    assert rep["pools"]["prefill"]["max_num_seqs"] == {"value": 256, "from": "preset",
                                                        "source": rep["pools"]["decode"]["max_num_seqs"]["source"]}
    line = preset_lines([r.summary])[0]
    assert "max_num_seqs={prefill: 256, decode: 1024}" in line and "block_size=16" in line


def test_a_plan_row_runs_the_policy_it_is_labelled_with():
    from batchsim.app.capacity.grid import build_configs

    # vllm-v0 picks chunked_prefill for llama-3.1-8b's 128K context, continuous at 8192 tokens
    v0 = scenario_from_dict(_raw("vllm-v0", model="llama-3.1-8b"))
    configs = build_configs(v0, policies=("continuous", "chunked_prefill"), knobs=[("policy.max_model_len", [8192])])
    assert {c.policy: scenario_from_dict(c.scenario).policy["name"] for c in configs} == {
        "continuous": "continuous", "chunked_prefill": "chunked_prefill"}
    # another preset (trtllm picks continuous) keeps the policy asked for
    v1 = scenario_from_dict(_raw("vllm-v1"))
    configs = build_configs(v1, policies=("chunked_prefill", "continuous"), knobs=[("engine_preset", ["vllm-v1", "trtllm"])])
    assert all(scenario_from_dict(c.scenario).policy["name"] == c.policy for c in configs) and len(configs) == 4
    # no --policies: the row names the policy that resolved for it
    configs = build_configs(v1, knobs=[("engine_preset", ["vllm-v1", "trtllm"])])
    assert [(c.policy, scenario_from_dict(c.scenario).policy["name"]) for c in configs] == [
        ("chunked_prefill", "chunked_prefill"), ("continuous", "continuous")]
    assert configs[1].label == "h100-sxm tp1 continuous engine_preset=trtllm"


def test_a_run_by_name_keeps_that_policy_when_the_preset_is_resolved_again():
    from batchsim.app.compare import scenario_data, with_policy

    sc = with_policy(scenario_from_dict(_raw("vllm-v1")), "chunked_prefill")
    data = scenario_data(sc)
    data["engine_preset"] = "trtllm"
    assert scenario_from_dict(data).policy["name"] == "chunked_prefill"


def _profile(tmp_path, base: str, name: str, **prov) -> str:
    import yaml

    from batchsim.calibrate.hardware import load_hardware

    data = load_hardware(base).model_dump(mode="json")
    data["name"] = name
    data["provenance"] = {**data["provenance"], **prov}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_renamed_calibrated_profile_keeps_its_devices_rules(tmp_path):
    from batchsim.calibrate.hardware import load_hardware
    from batchsim.engines import device_names

    bench = _profile(tmp_path, "a100-80gb", "prod-gpu", from_bench={"base_profile": "a100-80gb"})
    timed = _profile(tmp_path, "a100-80gb", "lab", calibration={"device": "NVIDIA A100-SXM4-80GB"})
    h100 = _profile(tmp_path, "h100-sxm", "prod-h", from_bench={"base_profile": "h100-sxm"})
    assert device_names(load_hardware(bench)) == ("prod-gpu", "a100-80gb")
    limits = {}
    for path in (bench, timed, h100):
        p = scenario_from_dict(_raw("vllm-v1", hardware=path)).policy
        limits[path] = (p["max_num_seqs"], p["max_num_batched_tokens"])
    assert limits == {bench: (256, 2048), timed: (256, 2048), h100: (1024, 8192)}
    b200 = _profile(tmp_path, "b200", "prod-b", from_bench={"base_profile": "b200"})
    graphs = scenario_from_dict(_raw("vllm-v1", hardware=b200)).policy["cuda_graphs"]
    assert graphs == scenario_from_dict(_raw("vllm-v1", hardware="b200")).policy["cuda_graphs"]


def test_policy_knobs_of_the_policy_the_preset_picked_apply_when_it_is_run_by_name():
    from batchsim.app.compare import with_policy

    sc = scenario_from_dict(_raw("vllm-v1", policy_knobs={"chunked_prefill": {"max_num_seqs": 64},
                                                          "continuous": {"max_num_seqs": 64}}))
    assert sc.policy["max_num_seqs"] == 1024  # (run without --policy: the preset's)
    for name in ("chunked_prefill", "continuous"):
        swapped = with_policy(sc, name)
        assert swapped.policy["name"] == name and swapped.policy["max_num_seqs"] == 64
        assert preset_report(swapped)["knobs"]["max_num_seqs"]["from"] == "scenario"
    # the scenario's own policy keys win over its policy_knobs; a section merges key by key
    sc = scenario_from_dict(_raw("vllm-v1", policy={"max_num_seqs": 128}, policy_knobs={"chunked_prefill": {
        "max_num_seqs": 64, "max_num_batched_tokens": 4096, "cuda_graphs": {"step_max_padding": 1.25}}}))
    own = with_policy(sc, "chunked_prefill").policy
    assert (own["max_num_seqs"], own["max_num_batched_tokens"]) == (128, 4096)
    assert own["cuda_graphs"]["step_max_padding"] == 1.25 and own["cuda_graphs"]["decode_sizes"]
    # the same without a preset
    raw = _raw(None, policy={"name": "continuous", "max_num_seqs": 128},
               policy_knobs={"continuous": {"max_num_seqs": 64, "max_num_batched_tokens": 1024}})
    raw.pop("engine_preset")
    plain = with_policy(scenario_from_dict(raw), "continuous").policy
    assert plain == {"name": "continuous", "max_num_seqs": 128, "max_num_batched_tokens": 1024}


def test_sglang_on_a_disaggregated_deployment_resolves_its_running_cap_per_pool():
    from batchsim.app.disagg import _pool_scenario

    pools = {"prefill": {"replicas": 1, "tensor_parallel_size": 4}, "decode": {"replicas": 1, "tensor_parallel_size": 4}}
    sc = scenario_from_dict(_raw("sglang", model="llama-3.1-70b", **_small(disaggregation=pools)))
    assert "max_num_seqs" not in sc.policy  # (the top level, TP 1, does not fit: its pools resolve it)
    colocated = scenario_from_dict(_raw("sglang", model="llama-3.1-70b", tensor_parallel_size=4))
    for name in ("prefill", "decode"):
        pool = _pool_scenario(sc, name, getattr(sc.disaggregation, name))
        assert pool.policy["max_num_seqs"] == colocated.policy["max_num_seqs"]
    r = simulate(sc, build_parts(sc))
    assert (r.requests["status"] == "completed").all()
    assert r.summary["engine_preset"]["knobs"]["max_num_seqs"]["from"] == "preset"
    # colocated, the same deployment does not fit: the error names the scenario's field
    with pytest.raises(InputError) as e:
        scenario_from_dict(_raw("sglang", model="llama-3.1-70b"), "s.yaml")
    assert e.value.where == "s.yaml: tensor_parallel_size" and "raise tensor_parallel_size" in e.value.message
    assert "--tp" not in e.value.message
    # and so does a pool's: the pool's field
    sc = scenario_from_dict(_raw("sglang", model="llama-3.1-70b", **_small(disaggregation={
        **pools, "prefill": {"replicas": 1, "tensor_parallel_size": 1}})))
    with pytest.raises(InputError) as e:
        simulate(sc, build_parts(sc))
    assert e.value.where == "disaggregation.prefill.tensor_parallel_size"
    assert "raise tensor_parallel_size" in e.value.message


def test_run_policy_with_set_policy_sets_the_policy_that_runs(tmp_path):
    """``batchsim run F --policy P --set policy.K=V``: the override is P's, not lost with the file's
    policy in the swap (it was, silently, and the report said the preset's value)."""
    from batchsim.app.compare import load_with_policy
    from batchsim.engines import preset_report

    path = tmp_path / "s.yaml"
    path.write_text("model: llama-3-8b\nhardware: h100-sxm\nengine_preset: vllm-v1\n"
                    "workload: {num_requests: 10}\n")
    sc = load_with_policy(path, "continuous", ["policy.max_num_seqs=7"])
    assert sc.policy["name"] == "continuous" and sc.policy["max_num_seqs"] == 7
    assert preset_report(sc)["knobs"]["max_num_seqs"]["from"] == "scenario"
    same = load_with_policy(path, None, ["policy.max_num_seqs=7"])  # (no swap: the file's policy)
    assert same.policy["name"] == "chunked_prefill" and same.policy["max_num_seqs"] == 7


def test_a_kernel_calibration_on_an_amd_cpu_is_not_a_rocm_gpu():
    from batchsim.calibrate.hardware import load_hardware
    from batchsim.engines import _rocm

    hw = load_hardware("h100-sxm")
    data = hw.model_dump(mode="json")

    def on(device):
        return type(hw).model_validate({**data, "name": "my-box",
                                        "provenance": {**data["provenance"], "calibration": {"device": device}}})

    cpu, gpu = on("AMD EPYC 7763 64-Core Processor"), on("AMD Instinct MI300X")
    assert not _rocm(cpu) and _rocm(gpu)
