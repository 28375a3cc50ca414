"""One test per error class, with the exact message a user sees.

Each message names the file (or the scenario field), the field or line, the
bad value and what was expected. docs/errors.md lists the same classes.
These run in-process; tests/test_robust_cli.py checks the CLI's exit code 2
and the absence of a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from batchsim import policies
from batchsim.calibrate.hardware import load_hardware
from batchsim.calibrate.models import load_model
from batchsim.app.config import load_scenario, scenario_from_dict
from batchsim.sim.errors import InputError
from batchsim.app.runner import run_scenario
from batchsim.workloads import WorkloadConfig, build_workload

SCENARIO_FIELDS = ("disaggregation, dtype, engine, engine_preset, engine_preset_values, hardware, horizon_s, kv_cache_dtype, max_queue_len, measure, model, name, overheads, policy, "
                   "policy_knobs, replicas, router, seed, slo, tensor_parallel_size, workload")
W = {"num_requests": 2}


def message(fn, *args, **kwargs) -> str:
    with pytest.raises(InputError) as e:
        fn(*args, **kwargs)
    return str(e.value)


def scenario_error(data) -> str:
    """The message for a scenario mapping, validated and then built and run."""
    return message(lambda: run_scenario(scenario_from_dict(data, "s.yaml")))


# ----------------------------------------------------------- scenario file


def test_missing_scenario_file(tmp_path):
    assert message(load_scenario, tmp_path / "nope.yaml") == f"no such scenario file: {tmp_path / 'nope.yaml'}"


def test_scenario_path_that_is_a_folder(tmp_path):
    assert message(load_scenario, tmp_path) == f"{tmp_path}: is a folder; expected a scenario YAML file"


def test_scenario_that_is_not_yaml_names_the_line(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("model: llama-3-8b\npolicy: [unclosed\n")
    assert message(load_scenario, p) == f"{p}:3: not valid YAML: expected ',' or ']', but got '<stream end>'"


def test_scenario_that_is_not_utf8(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_bytes(b"name: caf\xe9\n")
    assert message(load_scenario, p) == f"{p}: not UTF-8 text (invalid continuation byte at byte 9)"


@pytest.mark.parametrize("text, got", [("- 1\n- 2\n", "list"), ("42\n", "int"), ("", "NoneType")])
def test_scenario_that_is_not_a_mapping(tmp_path, text, got):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    assert message(load_scenario, p) == f"{p}: expected a mapping of scenario fields, got {got}"


def test_the_removed_fast_forward_field_is_named_in_one_line():
    for value in (True, False):
        assert scenario_error({"workload": W, "fast_forward": value}) == (
            "s.yaml: fast_forward: this field was removed (the Python engine runs step by step; "
            "engine: auto picks the compiled core, the fast one); delete it")


def test_unknown_field_lists_the_fields_allowed_there():
    assert scenario_error({"workload": W, "bogus": 1}) == (
        f"s.yaml: bogus: unknown field; expected one of {SCENARIO_FIELDS} (got 1)")
    assert scenario_error({"workload": {"num_requests": 2, "arival": {}}}) == (
        "s.yaml: workload.arival: unknown field; expected one of arrival, duration_s, num_requests, "
        "output_tokens, prompt_tokens, shared_prefix, trace")
    assert scenario_error({"workload": {"num_requests": 2, "arrival": {"process": "poisson", "rate": 1, "cv": 2}}}) == (
        "s.yaml: workload.arrival.cv: unknown field; expected one of process, rate (got 2)")


def test_wrong_type_and_out_of_range_values_show_the_value_and_the_bound():
    assert scenario_error({"workload": W, "replicas": "two"}) == (
        "s.yaml: replicas: Input should be a valid integer, unable to parse string as an integer (got 'two')")
    assert scenario_error({"workload": {"num_requests": 2, "arrival": {"process": "poisson", "rate": -1}}}) == (
        "s.yaml: workload.arrival.rate: Input should be greater than or equal to 0 (got -1)")


@pytest.mark.parametrize("path, value", [
    (("workload", "arrival", "rate"), float("inf")),
    (("workload", "duration_s"), float("inf")),
    (("workload", "prompt_tokens", "median"), float("nan")),
])
def test_non_finite_numbers_are_refused(path, value):
    data = {"workload": {"num_requests": 2, "arrival": {"process": "poisson", "rate": 1},
                         "prompt_tokens": {"dist": "lognormal", "median": 100, "p90": 200}}}
    data["workload"][path[1]] = value if len(path) == 2 else {**data["workload"][path[1]], path[2]: value}
    assert scenario_error(data) == f"s.yaml: {'.'.join(path)}: Input should be a finite number (got {value!r})"


def test_missing_section_and_missing_union_tag():
    assert scenario_error({}) == "s.yaml: workload: Field required"
    assert scenario_error({"workload": {"num_requests": 2, "arrival": {"rate": 3}}}) == (
        "s.yaml: workload.arrival: missing 'process'; expected one of poisson, gamma, constant, onoff, diurnal, empirical, closed")
    assert scenario_error({"workload": {"trace": {"path": "t.csv"}}}) == (
        "s.yaml: workload.trace: missing 'format'; expected one of azure, mooncake, burstgpt, vllm_bench, csv, "
        "jsonl, lengths")


def test_unknown_union_tag_lists_the_choices():
    assert scenario_error({"workload": {"num_requests": 2, "arrival": {"process": "poison", "rate": 1}}}) == (
        "s.yaml: workload.arrival: Input tag 'poison' found using 'process' does not match any of the expected "
        "tags: 'poisson', 'gamma', 'constant', 'onoff', 'diurnal', 'empirical', 'closed'")


def test_cross_field_errors_print_both_values_and_every_problem_gets_a_line():
    assert scenario_error({"replicas": 0, "workload": {
        "num_requests": 2, "prompt_tokens": {"dist": "uniform", "min": 5, "max": 3}}}) == (
        "s.yaml: replicas: Input should be greater than or equal to 1 (got 0)\n"
        "s.yaml: workload.prompt_tokens: max (3) must be >= min (5)")
    assert scenario_error({"workload": {}}) == (
        "s.yaml: workload: set num_requests or duration_s (or both) for a synthetic workload")


def test_a_yaml_alias_bomb_gives_a_short_message_quickly(tmp_path):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    p = tmp_path / "bomb.yaml"
    p.write_text("anchors:\n" + "\n".join("  " + x for x in lines) + "\nworkload: {num_requests: 1}\nname: *a8\n")
    msg = message(load_scenario, p)  # 9^9 strings once expanded; used to take minutes and gigabytes
    first, second = msg.split("\n")
    assert first.startswith(f"{p}: name: Input should be a valid string (got [[[...], [...],") and len(first) < 250
    assert second == f"{p}: anchors: unknown field; expected one of {SCENARIO_FIELDS}"


@pytest.mark.parametrize("override, expected", [
    ("replicas", "--set: expected dotted.key=value, got 'replicas'"),
    ("=3", "--set: empty key in '=3'"),
    ("workload..rate=3", "--set: empty field name in 'workload..rate'; expected dotted.key=value such as "
                         "workload.arrival.rate=8"),
])
def test_bad_set_overrides(tmp_path, override, expected):
    p = tmp_path / "s.yaml"
    p.write_text("workload: {num_requests: 2}\n")
    assert message(load_scenario, p, [override]) == expected


# ---------------------------------------------------------------- policies


@pytest.mark.parametrize("spec, expected", [
    ({"name": "fifo"}, "policy.name: unknown policy 'fifo'; expected one of chunked_prefill, continuous, dynamic, "
                       "static or 'package.module:ClassName'"),
    ({"name": ":Cls"}, "policy.name: cannot load policy ':Cls': Empty module name; expected "
                       "'package.module:ClassName'"),
    ({"name": ".mod:Cls"}, "policy.name: cannot load policy '.mod:Cls': the 'package' argument is required to "
                           "perform a relative import for '.mod'; expected 'package.module:ClassName'"),
    ({"name": "os:path"}, "policy.name: 'os:path' is not a batchsim policy: expected a class with a schedule(view) "
                          "method and a Config subclass of batchsim.policies.base.PolicyConfig"),
    ({"name": "continuous", "max_batch_size": 8},
     "policy.max_batch_size: unknown knob for policy 'continuous' (got 8); expected one of block_size, "
     "gpu_memory_utilization, gpu_memory_utilization_of, max_model_len, max_num_seqs, max_num_batched_tokens, order, "
     "admission, watermark, victim, schedule_ahead, cuda_graphs, enable_prefix_caching, "
     "prefill_mode"),
    ({"name": "static", "timeout_s": -1}, "policy.timeout_s: got -1; expected greater than or equal to 0"),
    ({"name": "static", "timeout_s": float("inf")}, "policy.timeout_s: got inf; expected a finite number"),
    ({"name": "dynamic", "max_queue_delay_s": float("nan")}, "policy.max_queue_delay_s: got nan; expected a finite number"),
    ({"name": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 4},
     "policy.max_num_batched_tokens: max_num_batched_tokens (4) must be >= max_num_seqs (8) so every running "
     "sequence can decode in each step"),
])
def test_policy_errors(spec, expected):
    assert message(policies.create_policy, spec) == expected


def test_router_error():
    assert scenario_error({"workload": W, "router": "random"}) == (
        "router: unknown router 'random'; expected one of round_robin, least_outstanding, power_of_two, least_kv, cache_aware")


# ------------------------------------------------------ models and hardware


def test_unknown_model_and_hardware_list_the_catalog():
    assert message(load_model, "gpt-17").startswith("unknown model 'gpt-17': not a catalog name (bloom-176b, ")
    assert message(load_hardware, "tpu").startswith("unknown hardware profile 'tpu': not a catalog name (a100-40gb, ")
    assert message(load_hardware, "tpu").endswith(f", mi300x) and no such file ({Path('tpu').resolve()})")


def config_json(tmp_path: Path, change: dict, drop: tuple = ()) -> Path:
    data = yaml.safe_load((Path(__file__).parents[1] / "batchsim" / "calibrate" / "catalog" / "llama-3-8b.yaml").read_text())
    data.update(change)
    for k in drop:
        data.pop(k, None)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize("change, drop, expected", [
    ({"hidden_size": "wide"}, (), "hidden_size: Input should be a valid integer, unable to parse string as an "
                                  "integer (got 'wide')"),
    ({"num_key_value_heads": 0}, (), "num_key_value_heads: Input should be greater than or equal to 1 (got 0)"),
    ({}, ("num_hidden_layers",), "num_hidden_layers: missing required field 'num_hidden_layers'"),
    ({"num_key_value_heads": 64}, (), "num_attention_heads (32) must be a multiple of num_key_value_heads (64)"),
    ({"num_local_experts": 8, "num_experts_per_tok": 9}, (),
     "num_experts_per_tok (9) must be in 1..num_local_experts (8)"),
])
def test_model_config_errors_name_file_field_and_value(tmp_path, change, drop, expected):
    p = config_json(tmp_path, change, drop)
    assert message(load_model, str(p)) == f"{p}: {expected}"


@pytest.mark.parametrize("text, expected", [
    ('{"hidden_size": 4096,', "not valid JSON: Expecting property name enclosed in double quotes: line 1 column 22 "
                              "(char 21)"),
    ("[1, 2]", "expected a mapping at the top level, got list"),
])
def test_model_config_that_is_not_a_json_object(tmp_path, text, expected):
    p = tmp_path / "config.json"
    p.write_text(text)
    assert message(load_model, str(p)) == f"{p}: {expected}"


def profile_yaml(tmp_path: Path, change: dict) -> Path:
    data = yaml.safe_load((Path(__file__).parents[1] / "batchsim" / "calibrate" / "profiles" / "h100-sxm.yaml").read_text())
    for key, value in change.items():
        *parents, last = key.split(".")
        d = data
        for k in parents:
            d = d[k]
        if value is None:
            del d[last]
        else:
            d[last] = value
    p = tmp_path / "gpu.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("change, expected", [
    ({"memory_gib": float("inf")}, "memory_gib: Input should be a finite number (got inf)"),
    ({"memory_gib": 1e300}, "memory_gib: Input should be less than or equal to 1000000 (got 1e+300)"),
    ({"peak_tflops": {"bf16": float("nan")}}, "peak_tflops.bf16: Input should be a finite number (got nan)"),
    ({"launch_latency_us": float("inf")}, "launch_latency_us: Input should be a finite number (got inf)"),
    ({"efficiency.gemm.compute": [[float("nan"), 0.5]]},
     "efficiency.gemm.compute.0.0: Input should be a finite number (got nan)"),
    ({"efficiency.gemm.compute": [[2, 0.5], [1, 0.6]]},
     "efficiency.gemm.compute: curve sizes must be strictly increasing, got [2.0, 1.0] "
     "(got [[2, 0.5], [1, 0.6]])"),
    ({"efficiency.gemm": None}, "efficiency is missing operator classes ['gemm']"),
])
def test_hardware_profile_errors_name_file_field_and_value(tmp_path, change, expected):
    p = profile_yaml(tmp_path, change)
    assert message(load_hardware, str(p)) == f"{p}: {expected}"


def test_a_model_that_does_not_fit_says_by_how_much():
    assert scenario_error({"workload": W, "model": "llama-3.1-405b", "hardware": "l4"}) == (
        "llama-3.1-405b (bf16) does not fit on l4 at tp=1: 0.9 x 24 GiB = 21.6 GiB per GPU, but weights take "
        "756.0 GiB, runtime reserve 1.0 GiB and activations 3.3 GiB, leaving -738.7 GiB for the KV cache; "
        "raise tensor_parallel_size or use a smaller dtype")


# ---------------------------------------------------------------- workloads


@pytest.mark.parametrize("workload, expected", [
    ({"num_requests": 2 * 10**8}, "s.yaml: workload.num_requests: Input should be less than or equal to "
                                  "100000000 (got 200000000)"),
    ({"duration_s": 1e9, "arrival": {"process": "poisson", "rate": 12}},
     "workload.duration_s: about 1.2e+10 requests arrive within duration_s; expected at most 100000000 "
     "(shorten duration_s, lower the rate or set num_requests)"),
    ({"num_requests": 2, "prompt_tokens": {"dist": "fixed", "value": 2**41}},
     "s.yaml: workload.prompt_tokens.value: Input should be less than or equal to 1099511627776 (got 2199023255552)"),
    ({"num_requests": 2, "arrival": {"process": "gamma", "rate": 1, "cv": 1e-9}},
     "s.yaml: workload.arrival.cv: cv 1e-09 is too small; expected 0.001 to 100 (use process: constant for even "
     "gaps) (got 1e-09)"),
    ({"num_requests": 2, "arrival": {"process": "onoff", "rate_on": 1e9, "mean_on_s": 1, "mean_off_s": 1}},
     "s.yaml: workload.arrival: rate_on x mean_on_s = 1e+09 requests per on period; expected at most 1e+07"),
    ({"num_requests": 2, "arrival": {"process": "onoff", "rate_on": 1e-9, "mean_on_s": 1, "mean_off_s": 1}},
     "workload.arrival: 2 requests at a mean 5e-10 requests/s take about 4.8e+09 on/off periods; expected at "
     "most 1e+08 (use longer periods or higher rates)"),
    ({"num_requests": 2, "prompt_tokens": {"dist": "fixed", "value": 2**30},
      "shared_prefix": {"groups": 2, "tokens": 100, "block_tokens": 16}},
     "workload.shared_prefix.block_tokens: a 1073741824-token prompt makes 67108864 blocks of 16 tokens; expected "
     "at most 1048576 per prompt (raise block_tokens or shorten the prompts)"),
    ({"num_requests": 3, "arrival": {"process": "constant", "rate": 1e-12}},
     "workload.arrival: the last request arrives at 2e+12 s; expected every arrival within 1e+10 s (raise the "
     "rate or shorten the trace's span)"),
])
def test_workloads_too_big_or_too_extreme_to_generate(workload, expected):
    assert scenario_error({"workload": workload}) == expected


def trace_error(tmp_path: Path, name: str, body: str | bytes, **trace) -> str:
    p = tmp_path / name
    (p.write_bytes if isinstance(body, bytes) else p.write_text)(body)
    cfg = WorkloadConfig.model_validate({"trace": {"path": name, **trace}})
    return message(build_workload, cfg, np.random.default_rng(0), tmp_path)


@pytest.mark.parametrize("body, expected", [
    ("arrival,prompt_tokens,output_tokens\n0,1e30,5\n",
     "line 2, column 'prompt_tokens': '1e+30' is too large; expected a whole number of tokens >= 0 and at most "
     "1099511627776"),
    ("arrival,prompt_tokens,output_tokens\n0,10,9223372036854775808\n",
     "line 2, column 'output_tokens': '9223372036854775808' is too large; expected a whole number of tokens >= 0 "
     "and at most 1099511627776"),
    ("arrival,prompt_tokens,output_tokens\n0,10,5\n1,x,5\n",
     "line 3, column 'prompt_tokens': 'x' is not a number; expected a whole number of tokens >= 0"),
])
def test_csv_trace_values(tmp_path, body, expected):
    assert trace_error(tmp_path, "t.csv", body, format="csv") == f"{tmp_path / 't.csv'}, {expected}"


def test_jsonl_trace_with_a_huge_integer_or_deep_nesting(tmp_path):
    big = '{"arrival": 0, "prompt_tokens": ' + "9" * 400 + ', "output_tokens": 5}\n'
    assert trace_error(tmp_path, "t.jsonl", big, format="jsonl") == (
        f"{tmp_path / 't.jsonl'}, line 1, column 'prompt_tokens': "
        "'999999999999999999999999999999999999999999999999999999999...' is too large; expected a whole number "
        "of tokens >= 0")
    deep = '{"arrival": 0, "prompt_tokens": 5, "output_tokens": 5}\n{"x": ' + "[" * 5000 + "]" * 5000 + "}\n"
    assert trace_error(tmp_path, "t.jsonl", deep, format="jsonl") == (
        f"{tmp_path / 't.jsonl'}, line 2: JSON nested too deeply: '{{\"x\": {'[' * 51}...'; expected one flat "
        "JSON object per line")


def test_trace_speedup_that_overflows_arrival_times(tmp_path):
    assert trace_error(tmp_path, "t.csv", "arrival,prompt_tokens,output_tokens\n0,10,5\n2,10,5\n",
                       format="csv", speedup=1e-320) == (
        f"{tmp_path / 't.csv'}: speedup: speedup 9.99989e-321 puts arrival times beyond float range; expected a "
        "speedup that keeps 2 s finite")


@pytest.mark.parametrize("change, expected", [
    ({"burstiness": float("inf")}, "field 'burstiness': 'inf' is not finite; expected vLLM's gamma shape (1 = Poisson)"),
    ({"request_rate": 1e-308}, "field 'request_rate': '1e-308' puts arrival times beyond 1.55e+308 s; expected a "
                               "rate that replays the file in finite time"),
])
def test_vllm_bench_recorded_arrivals_that_cannot_be_drawn(tmp_path, change, expected):
    doc = {"input_lens": [10] * 8, "output_lens": [5] * 8, "request_rate": 1.0, **change}
    assert trace_error(tmp_path, "v.json", json.dumps(doc), format="vllm_bench") == f"{tmp_path / 'v.json'}, {expected}"
    deep = "[" * 100_000 + "]" * 100_000
    assert trace_error(tmp_path, "v.json", deep, format="vllm_bench") == (
        f"{tmp_path / 'v.json'}: JSON nested too deeply; expected the object vllm bench serve saves")


# ------------------------------------------------------------ safe loading

UNSAFE_CALLS = {("yaml", "load"), ("yaml", "unsafe_load"), ("yaml", "full_load"), ("yaml", "load_all"),
                ("pickle", "load"), ("pickle", "loads"), ("marshal", "loads"), ("pd", "read_pickle"),
                ("pandas", "read_pickle"), ("torch", "load"), ("dill", "load"), ("shelve", "open")}


def test_user_files_are_loaded_safely_everywhere():
    """No yaml.load / pickle / eval / exec in the packages: user files are data, never code.

    (A ``package.module:ClassName`` policy name imports that module on purpose:
    it is how a user plugs in their own scheduler.)
    """
    import ast

    root = Path(__file__).resolve().parents[1]
    found = []
    for pkg in ("batchsim",):
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                if isinstance(f, ast.Name) and f.id in ("eval", "exec"):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {f.id}()")
                elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and \
                        (f.value.id, f.attr) in UNSAFE_CALLS:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {f.value.id}.{f.attr}()")
                elif isinstance(f, ast.Attribute) and f.attr == "load" and any(
                        k.arg == "allow_pickle" for k in node.keywords):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: load(allow_pickle=...)")
    assert found == []


@pytest.mark.parametrize("name", ["bad\x00name", "a" * 5000])
def test_paths_the_os_refuses_are_not_found_not_a_crash(tmp_path, name):
    assert message(load_scenario, name) == f"no such scenario file: {name}"
    assert message(load_model, name).startswith(f"unknown model {name!r}: not a catalog name (")
    assert message(load_hardware, name).endswith(f"and no such file ({tmp_path.cwd() / name})")
    cfg = WorkloadConfig.model_validate({"trace": {"format": "csv", "path": name}})
    assert message(build_workload, cfg, np.random.default_rng(0), tmp_path) == (
        f"{name}: file not found (resolved to {tmp_path / name}); expected an existing trace file")


def test_python_yaml_tags_are_refused_not_run(tmp_path):
    p = tmp_path / "evil.yaml"
    p.write_text('name: !!python/object/apply:os.system ["touch pwned"]\nworkload: {num_requests: 1}\n')
    expected = ("not valid YAML: could not determine a constructor for the tag "
                "'tag:yaml.org,2002:python/object/apply:os.system'")
    assert message(load_scenario, p) == f"{p}:1: {expected}"
    assert message(load_hardware, str(p)) == f"{p}:1: {expected}"
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_files_nested_too_deeply(tmp_path):
    p = tmp_path / "deep.yaml"
    p.write_text("[" * 600 + "]" * 600)  # past the recursion limit (PyYAML's scanner is quadratic in depth)
    assert message(load_scenario, p) == f"{p}: nested too deeply; expected a mapping of scenario fields"
    assert message(load_hardware, str(p)) == f"{p}: nested too deeply; expected a mapping of fields"
    q = tmp_path / "s.yaml"
    q.write_text("workload: {num_requests: 1}\n")
    deep = "[" * 600 + "]" * 600  # a --set value: kept as text, then refused by validation
    assert message(load_scenario, q, [f"workload.arrival={deep}"]) == (
        f"{q}: workload.arrival: Input should be a valid dictionary or object to extract fields from "
        f"(got '{'[' * 37}...{']' * 38}')")


def test_model_config_that_is_not_utf8(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"name": "caf\xe9"}')
    assert message(load_model, str(tmp_path)) == (
        f"{tmp_path / 'config.json'}: not UTF-8 text (invalid continuation byte at byte 13)")


# ------------------------------------------------ values that used to pass


def test_duplicate_yaml_keys_are_refused_with_the_key_and_line(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("workload: {num_requests: 2}\nreplicas: 1\nreplicas: 2\n")
    assert message(load_scenario, p) == (
        f"{p}:3: not valid YAML: duplicate key 'replicas' (first at line 2); expected each key once")
    p.write_text("workload:\n  num_requests: 2\n  num_requests: 3\n")
    assert message(load_scenario, p) == (
        f"{p}:3: not valid YAML: duplicate key 'num_requests' (first at line 2); expected each key once")
    p.write_text("workload: {num_requests: 2}\n")
    assert message(load_scenario, p, ["policy={name: continuous, name: static}"]) == (
        "--set: duplicate key 'name' in 'policy={name: continuous, name: static}'; expected each key once")
    p.write_text("workload: &w {num_requests: 2, duration_s: 5}\npolicy_knobs: {static: {<<: *w, num_requests: 3}}\n")
    assert load_scenario(p).policy_knobs["static"]["num_requests"] == 3  # a merged key may be overridden
    profile = profile_yaml(tmp_path, {})
    lines = profile.read_text().splitlines()
    first = next(i for i, line in enumerate(lines, 1) if line.startswith("memory_gib:"))
    profile.write_text(profile.read_text() + "memory_gib: 10\n")
    assert message(load_hardware, str(profile)) == (
        f"{profile}:{len(lines) + 1}: not valid YAML: duplicate key 'memory_gib' (first at line {first}); "
        "expected each key once")


@pytest.mark.parametrize("data, expected", [
    ({"workload": {"num_requests": True}}, "workload.num_requests: Input should be an integer, not a boolean (got True)"),
    ({"workload": W, "tensor_parallel_size": True},
     "tensor_parallel_size: Input should be an integer, not a boolean (got True)"),
    ({"workload": W, "replicas": True}, "replicas: Input should be an integer, not a boolean (got True)"),
    ({"workload": W, "seed": False}, "seed: Input should be an integer, not a boolean (got False)"),
    ({"workload": {"num_requests": 2, "arrival": {"process": "poisson", "rate": True}}},
     "workload.arrival.rate: Input should be a number, not a boolean (got True)"),
    ({"workload": {"num_requests": 2, "prompt_tokens": {"dist": "fixed", "value": True}}},
     "workload.prompt_tokens.value: Input should be an integer, not a boolean (got True)"),
])
def test_booleans_are_not_numbers_in_a_scenario(data, expected):
    assert scenario_error(data) == f"s.yaml: {expected}"


def test_booleans_are_not_numbers_in_a_policy_and_whole_floats_still_are():
    assert message(policies.create_policy, {"name": "continuous", "max_num_seqs": True}) == (
        "policy.max_num_seqs: got True; expected an integer, not a boolean")
    assert message(policies.create_policy, {"name": "continuous", "gpu_memory_utilization": True}) == (
        "policy.gpu_memory_utilization: got True; expected a number, not a boolean")
    assert message(policies.create_policy, {"name": "dynamic", "preferred_batch_sizes": [True, 2]}) == (
        "policy.preferred_batch_sizes: got [True, 2]; expected an integer, not a boolean")
    assert policies.create_policy({"name": "continuous", "enable_prefix_caching": False}).config.enable_prefix_caching \
        is False
    assert scenario_from_dict({"workload": {"num_requests": 2.0}, "replicas": 2.0}).replicas == 2
    assert scenario_from_dict({"workload": W, "measure": {"step_records": False}}).measure.step_records is False


def test_max_model_len_beyond_the_models_context_names_both_values():
    assert scenario_error({"workload": W, "policy": {"name": "continuous", "max_model_len": 100_000}}) == (
        "policy.max_model_len: got 100000, above llama-3-8b's context length (max_position_embeddings 8192); "
        "expected at most 8192")
    assert run_scenario(scenario_from_dict({"workload": W, "policy": {"name": "continuous", "max_model_len": 8192}}))


@pytest.mark.parametrize("where, value", [("policy", 7), ("policy", 512), ("policy", 0), ("policy_knobs.static", 12)])
def test_block_sizes_vllm_refuses(where, value):
    data = {"workload": W}
    if where == "policy":
        data["policy"] = {"name": "continuous", "block_size": value}
    else:
        data["policy_knobs"] = {"static": {"block_size": value}}
    assert message(scenario_from_dict, data, "s.yaml") == (
        f"s.yaml: {where}.block_size: got {value}; expected one of vLLM's block sizes 1, 8, 16, 32, 64, 128, 256")
    assert scenario_from_dict({"workload": W, "policy": {"name": "continuous", "block_size": 32}})


def test_a_tensor_parallel_size_from_the_scenario_names_the_field_not_the_option():
    assert scenario_error({"workload": W, "tensor_parallel_size": 3}) == (
        "tensor_parallel_size: num_attention_heads (32) is not divisible by tensor_parallel_size=3 for llama-3-8b")
    from batchsim.calibrate.report import cost_report  # the cost command's --tp keeps its name
    assert message(cost_report, "llama-3-8b", "h100-sxm", tp=3, prefill=8) == (
        "--tp 3 for llama-3-8b: num_attention_heads (32) is not divisible by tp=3")


@pytest.mark.parametrize("kind", ["scenario", "trace", "model", "hardware", "empirical"])
def test_a_folder_where_a_file_is_expected_says_so(tmp_path, kind):
    d = tmp_path / "adir"
    d.mkdir()
    if kind == "scenario":
        assert message(load_scenario, d) == f"{d}: is a folder; expected a scenario YAML file"
    elif kind == "model":
        assert message(load_model, str(d)) == (
            f"{d}: is a folder (resolved to {d}); expected a config.json file or a folder holding one")
    elif kind == "hardware":
        assert message(load_hardware, str(d)) == f"{d}: is a folder (resolved to {d}); expected a hardware profile YAML file"
    else:
        wl = ({"trace": {"format": "csv", "path": "adir"}} if kind == "trace" else
              {"num_requests": 2, "prompt_tokens": {"dist": "empirical", "path": "adir", "column": "x"}})
        cfg = WorkloadConfig.model_validate(wl)
        assert message(build_workload, cfg, np.random.default_rng(0), tmp_path) == (
            f"adir: is a folder (resolved to {d}); expected a trace file")


class _NotAPlanConfig(policies.PolicyConfig):
    pass


class NotAPlan:
    """A plugin policy whose schedule returns a dict, not a BatchPlan."""

    name = "not_a_plan"
    Config = _NotAPlanConfig

    def __init__(self, config=None):
        self.config = config or _NotAPlanConfig(name=self.name)

    def schedule(self, view):
        return {"num_tokens": {}}


def test_a_plugin_whose_schedule_returns_no_plan_is_named_in_one_line():
    assert scenario_error({"workload": W, "policy": {"name": f"{__name__}:NotAPlan"}}) == (
        f"policy: '{__name__}:NotAPlan' broke the engine contract: schedule() returned dict; expected a "
        "batchsim.sim.types.BatchPlan")


def test_a_set_value_with_a_byte_that_is_not_utf8_is_kept_as_text(tmp_path):
    q = tmp_path / "s.yaml"
    q.write_text("workload: {num_requests: 1}\n")
    assert load_scenario(q, ["name=\udcff"]).name == "\udcff"
