"""Steps padded to an engine's CUDA-graph capture sizes (``cuda_graphs``), worked by hand.

vLLM V1 replays a step of n tokens from the graph captured for the smallest capture size
at least n (its dense operators then run at that many tokens; attention and the LM head on
the real rows), SGLang does so for decode batches and, within twice their tokens, for
prefill batches, vLLM V0 for decode batches whose contexts fit ``max_seq_len_to_capture``.
The rule is batchsim.policies.step.graph_tokens; both engines run it (tests/test_core.py
compares them, with and without graphs).
"""

from __future__ import annotations

import numpy as np
import pytest

from batchsim import policies
from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_parts, simulate
from batchsim.calibrate.costmodel import RooflineCostModel
from batchsim.calibrate.hardware import load_hardware
from batchsim.calibrate.models import load_model
from batchsim.engines import preset_report
from batchsim.policies.recipe import CudaGraphs
from batchsim.policies.step import graph_tokens
from batchsim.sim.errors import InputError
from batchsim.sim.types import StepShape
from tests.test_robust_errors import message

VLLM = tuple([1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)])
SGLANG_DECODE = tuple([1, 2, 4, 8, 12, *range(16, 257, 8)])
SGLANG_PREFILL = tuple([*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
                        *range(1280, 4097, 256), *range(4608, 8193, 512)])


def test_a_step_runs_at_the_smallest_capture_size_at_least_its_tokens():
    g = CudaGraphs(decode_sizes=VLLM, step_sizes=VLLM)
    assert [graph_tokens(g, t, True, 100) for t in (1, 3, 5, 9, 16, 249, 257, 512)] == [1, 4, 8, 16, 16, 256, 272, 512]
    assert graph_tokens(g, 513, True, 100) == 513  # above the largest size: eager, its own count
    assert graph_tokens(g, 475, False, 467) == 480  # a mixed step (467-token prompt and 8 decodes)


def test_sglang_pads_prefills_only_within_twice_their_tokens():
    g = CudaGraphs(decode_sizes=SGLANG_DECODE, step_sizes=SGLANG_PREFILL, step_max_padding=2.0)
    assert graph_tokens(g, 9, True, 500) == 12 and graph_tokens(g, 200, True, 500) == 200
    assert graph_tokens(g, 257, True, 500) == 257  # above max_bs 256: eager
    assert graph_tokens(g, 467, False, 467) == 480 and graph_tokens(g, 1025, False, 1025) == 1280
    assert graph_tokens(g, 8193, False, 8193) == 8193
    assert graph_tokens(g, 3, False, 3) == 4  # 4 <= 2 x 3
    # a bucket more than twice the tokens is not replayed (one 1-token prompt is a one-token-rows step)
    assert graph_tokens(CudaGraphs(step_sizes=(8,), step_max_padding=2.0), 3, False, 3) == 3


@pytest.mark.parametrize("engine", ["python", "core"])
def test_a_prompts_last_token_is_not_a_decode(engine):
    # a 17-token prompt in 16-token chunks: its second step computes one prompt token, a prefill step
    raw = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": engine,
           "policy": {"name": "chunked_prefill", "max_num_seqs": 4, "max_num_batched_tokens": 16,
                      "cuda_graphs": {"decode_sizes": [8], "step_sizes": [16]}},
           "workload": {"num_requests": 1, "arrival": {"process": "poisson", "rate": 1.0},
                        "prompt_tokens": {"dist": "fixed", "value": 17}, "output_tokens": {"dist": "fixed", "value": 3}}}
    sc = scenario_from_dict(raw)
    parts = build_parts(sc)
    steps = simulate(sc, parts).steps
    # (the step records count a one-token row over a context as a decode token; the engine knows it is a prompt's)
    assert (steps["prefill_tokens"] + steps["decode_tokens"]).tolist() == [16, 1, 1, 1]
    extra = (steps["flops"] - steps["useful_flops"]).tolist()
    dense = lambda t: parts.cost.dense_totals(t, 0)[4]  # noqa: E731
    assert extra[0] == 0 and extra[1] == pytest.approx(dense(16) - dense(1), rel=1e-9)  # the step sizes
    assert extra[2] == pytest.approx(dense(8) - dense(1), rel=1e-9)  # a decode: the decode sizes


def test_vllm_v0_pads_decodes_only_within_its_capture_context():
    g = CudaGraphs(decode_sizes=(1, 2, 4, 8), decode_max_context=8192)
    assert graph_tokens(g, 5, True, 8192) == 8 and graph_tokens(g, 5, True, 8193) == 5
    assert graph_tokens(g, 5, False, 100) == 5  # no graphs for prefills


def test_the_dense_operators_run_at_the_padded_tokens_and_attention_on_the_real_rows():
    cost = RooflineCostModel(load_model("llama-3.1-8b"), load_hardware("h100-sxm"), tp=2)
    rows = dict(q=np.ones(9, np.int64), kv=np.arange(100, 109, dtype=np.int64), sampled=9)
    plain, padded = cost.price(StepShape(**rows)), cost.price(StepShape(**rows, dense_tokens=16))
    d9, d16 = cost.dense_totals(9, 9), cost.dense_totals(16, 9)  # (compute, memory, network, overhead, flops, ...)
    assert padded.seconds - plain.seconds == pytest.approx(sum(d16[:4]) - sum(d9[:4]), rel=1e-9)
    assert padded.flops - plain.flops == pytest.approx(2 * (d16[4] - d9[4]), rel=1e-9)
    assert padded.network_s > plain.network_s  # the padding tokens are all-reduced too
    # the breakdown prices the same step the same way
    assert cost.price(StepShape(**rows, dense_tokens=16), breakdown=True).seconds == pytest.approx(padded.seconds)
    assert cost.price(StepShape(**rows, dense_tokens=9)).seconds == plain.seconds


@pytest.mark.parametrize("engine", ["python", "core"])
def test_every_step_is_billed_its_padding_and_mfu_counts_the_real_tokens(engine):
    raw = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": engine, "seed": 3,
           "policy": {"name": "chunked_prefill", "max_num_seqs": 64, "max_num_batched_tokens": 512,
                      "cuda_graphs": {"decode_sizes": list(VLLM), "step_sizes": list(VLLM)}},
           "workload": {"num_requests": 120, "arrival": {"process": "poisson", "rate": 20.0},
                        "prompt_tokens": {"dist": "lognormal", "median": 300, "p90": 900, "max": 2000},
                        "output_tokens": {"dist": "lognormal", "median": 60, "p90": 200, "max": 400}}}
    sc = scenario_from_dict(raw)
    parts = build_parts(sc)
    steps = simulate(sc, parts).steps
    g = CudaGraphs(decode_sizes=VLLM, step_sizes=VLLM)
    cost, padded = parts.cost, 0
    for rows, pre, dec, flops, useful in zip(steps["num_rows"], steps["prefill_tokens"], steps["decode_tokens"],
                                             steps["flops"], steps["useful_flops"]):
        T = int(pre + dec)
        D = graph_tokens(g, T, T == rows, 0)
        want = cost.dense_totals(D, 0)[4] - cost.dense_totals(T, 0)[4]  # (the LM head is the same on both)
        assert flops - useful == pytest.approx(want, rel=1e-9, abs=1e-3)
        padded += D > T
    assert padded > len(steps) // 2  # most steps were padded: the case under test happened
    assert (steps["padding_tokens"] == 0).all()  # graph padding is not a padded batch's padding rows


def _scenario(preset, hardware="h100-sxm", tp=1, **policy):
    raw = {"model": "llama-3.1-8b" if tp == 1 else "llama-3.1-70b", "hardware": hardware, "tensor_parallel_size": tp,
           "engine_preset": preset, "workload": {"num_requests": 10}}
    if policy:
        raw["policy"] = policy
    return scenario_from_dict(raw)


def test_the_presets_derive_the_engines_default_capture_sizes():
    v1 = _scenario("vllm-v1").policy["cuda_graphs"]  # 1024 seqs, 8192 tokens on an H100
    assert v1 == {"decode_sizes": list(VLLM), "step_sizes": list(VLLM)}
    assert _scenario("vllm-v1", "b200").policy["cuda_graphs"]["step_sizes"][-1] == 1024  # data-centre Blackwell
    small = _scenario("vllm-v1", max_num_batched_tokens=300).policy["cuda_graphs"]["step_sizes"]
    assert small[-5:] == [248, 256, 272, 288, 300]  # capped at the token budget, which is captured too
    assert _scenario("vllm-v1", "a100-40gb").policy["cuda_graphs"]["step_sizes"][-1] == 512  # 256 seqs x 2
    v0 = _scenario("vllm-v0").policy["cuda_graphs"]
    assert v0 == {"decode_sizes": [1, 2, 4, *range(8, 257, 8)], "decode_max_context": 8192}
    assert _scenario("vllm-v0", max_num_seqs=100).policy["cuda_graphs"]["decode_sizes"][-1] == 104
    sg = _scenario("sglang").policy["cuda_graphs"]
    assert sg == {"decode_sizes": list(SGLANG_DECODE), "step_sizes": list(SGLANG_PREFILL), "step_max_padding": 2.0}
    assert _scenario("sglang", "h200", tp=4).policy["cuda_graphs"]["decode_sizes"][-3:] == [480, 496, 512]
    assert _scenario("sglang", "a100-40gb").policy["cuda_graphs"]["decode_sizes"][-1] == 32
    assert _scenario("sglang", "mi300x").policy["cuda_graphs"]["step_sizes"] == []  # breakable graphs: CUDA only
    capped = _scenario("sglang", max_num_seqs=100).policy["cuda_graphs"]  # --max-running-requests 100
    assert capped["decode_sizes"][-3:] == [88, 96, 100] and capped["step_sizes"][-1] == 8192
    llama2 = scenario_from_dict({"model": "llama-2-7b", "hardware": "h100-sxm", "engine_preset": "sglang",
                                 "workload": {"num_requests": 10}}).policy["cuda_graphs"]
    assert llama2["step_sizes"][-1] == 4096
    assert _scenario("trtllm").policy["cuda_graphs"] is None  # TensorRT-LLM: enable_padding=False


def test_a_scenario_can_turn_the_presets_graphs_off_and_the_summary_says_so():
    sc = _scenario("vllm-v1", cuda_graphs=None)
    assert sc.policy["cuda_graphs"] is None
    knob = preset_report(sc)["knobs"]["cuda_graphs"]
    assert knob["from"] == "scenario" and knob["preset_value"]["step_sizes"][-1] == 512
    assert _scenario("vllm-v1", cuda_graphs={}).policy["cuda_graphs"] == {}  # (a section with no sizes: off too)


def test_one_key_of_the_graphs_section_keeps_the_presets_sizes_and_follows_the_deployment():
    from batchsim.app.config import apply_overrides

    raw = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine_preset": "sglang", "workload": {"num_requests": 10}}
    sc = scenario_from_dict(apply_overrides(raw, ["policy.cuda_graphs.step_max_padding=1.5"]))
    g = sc.policy["cuda_graphs"]  # the scenario's key wins, the preset fills the others
    assert g == {"decode_sizes": list(SGLANG_DECODE), "step_sizes": list(SGLANG_PREFILL), "step_max_padding": 1.5}
    knob = preset_report(sc)["knobs"]["cuda_graphs"]
    assert knob["from"] == "scenario and preset" and knob["set_by_scenario"] == ["step_max_padding"]
    # resolved again on another deployment (as a sweep over tp does): the preset's sizes follow it, the key stays
    data = sc.model_dump(mode="json", exclude_unset=True)
    again = scenario_from_dict({**data, "hardware": "h200", "tensor_parallel_size": 4})
    assert again.policy["cuda_graphs"]["decode_sizes"][-1] == 512 and again.policy["cuda_graphs"]["step_max_padding"] == 1.5
    # and --set on a scenario already resolved takes one key, not the section
    later = scenario_from_dict(apply_overrides(data, ["policy.cuda_graphs.decode_sizes=[1,2,4]"]))
    assert later.policy["cuda_graphs"] == {"decode_sizes": [1, 2, 4], "step_sizes": list(SGLANG_PREFILL),
                                           "step_max_padding": 1.5}


def test_sizes_a_step_never_reaches_are_refused_and_bad_knobs_are_not_hidden_by_the_derivation():
    with pytest.raises(InputError) as e:
        policies.create_policy({"name": "chunked_prefill", "max_num_batched_tokens": 256,
                                "cuda_graphs": {"step_sizes": [128, 4096]}})
    assert "4096 is above max_num_batched_tokens (256)" in str(e.value)
    for preset in ("vllm-v1", "vllm-v0", "sglang"):  # the bad knob is the error, not the sizes made from it
        for bad in ({"max_num_seqs": "abc"}, {"max_num_seqs": None}, {"max_num_batched_tokens": "abc"}):
            with pytest.raises(InputError) as e:
                policies.create_policy(_scenario(preset, **bad).policy)
            assert e.value.where == f"policy.{next(iter(bad))}" and "cuda_graphs" not in str(e.value), str(e.value)
    assert _scenario("sglang", "h100-sxm", 4, max_num_batched_tokens=300).policy["cuda_graphs"]["decode_sizes"][-1] == 288


@pytest.mark.parametrize("graphs, expected", [
    ({"decode_sizes": [8, 4]}, "policy.cuda_graphs.decode_sizes: sizes must increase strictly, got 8 then 4"),
    ({"step_sizes": [0, 4]}, "policy.cuda_graphs.step_sizes: capture sizes must be integers >= 1, got 0"),
    ({"step_max_padding": 0.5}, "policy.cuda_graphs.step_max_padding: step_max_padding must be 0 (no limit) or a "
                                "factor from 1 to 1e6, got 0.5"),
    ({"step_max_padding": float("inf")}, "policy.cuda_graphs.step_max_padding: step_max_padding must be 0 (no limit) "
                                         "or a factor from 1 to 1e6, got inf"),
    ({"decode_sizes": [True, 2]}, "policy.cuda_graphs.decode_sizes: capture sizes must be integers >= 1, got True"),
    ({"decode_max_context": True}, "policy.cuda_graphs.decode_max_context: decode_max_context must be an integer "
                                   "from 0 (no limit) to 2^40, got True"),
    ({"step_sizes": list(range(1, 3000))}, "policy.cuda_graphs.step_sizes: at most 2048 capture sizes, got 2999"),
    ({"sizes": [1]}, "policy.cuda_graphs.sizes: unknown knob for cuda_graphs of policy 'continuous' (got [1]); "
                     "expected one of decode_sizes, step_sizes, step_max_padding, decode_max_context"),
])
def test_bad_capture_sizes_are_named(graphs, expected):
    assert message(policies.create_policy, {"name": "continuous", "cuda_graphs": graphs}) == expected
    with pytest.raises(InputError):
        policies.create_policy({"name": "continuous", "cuda_graphs": graphs})


def test_the_run_table_shows_the_sizes_in_one_line():
    from batchsim.app.summary_table import preset_lines

    (line,) = preset_lines([{"engine_preset": preset_report(_scenario("vllm-v1"))}])
    assert "cuda_graphs={decode_sizes: [51 sizes 1..512], step_sizes: [51 sizes 1..512]}" in line


def test_a_calibration_prices_the_executors_graph_steps_padded_as_they_ran():
    from batchsim.app.validate import as_run

    three = StepShape.of([(1, 100)] * 3)
    for mode in ("graph", "capture+graph", "static"):  # the executor's static layout pads to 4 rows
        ran = as_run(three, mode)
        assert (ran.dense_tokens, ran.sampled, ran.num_rows) == (4, 4, 3)
    for mode in (None, "eager", "eager+graph"):
        assert as_run(three, mode) is three
    assert as_run(StepShape.of([(1, 100)] * 8), "graph").dense_tokens == 0  # a capture size: nothing to pad


def test_cost_prices_a_step_replayed_from_a_larger_graph_as_a_run_does():
    from batchsim.calibrate.report import cost_report

    plain = cost_report("llama-3.1-8b", "h100-sxm", decode=5, context=500)
    padded = cost_report("llama-3.1-8b", "h100-sxm", decode=5, context=500, graph_tokens=8)
    cm = RooflineCostModel(load_model("llama-3.1-8b"), load_hardware("h100-sxm"))
    shape = StepShape.of([(1, 500)] * 5)
    want = cm.price(StepShape(q=shape.q, kv=shape.kv, sampled=5, dense_tokens=8))
    assert padded["total"]["seconds"] == pytest.approx(want.seconds) and padded["total"]["flops"] == want.flops
    assert padded["total"]["seconds"] > plain["total"]["seconds"]
    assert padded["useful_flops"] == plain["total"]["flops"] < padded["total"]["flops"]  # MFU: the real tokens
    ops = {o["name"]: o for o in padded["operators"]}
    assert ops["attention"]["flops"] == {o["name"]: o for o in plain["operators"]}["attention"]["flops"]
    assert padded["step"]["graph_tokens"] == 8
    with pytest.raises(InputError, match="below the step's 5 tokens"):
        cost_report("llama-3.1-8b", "h100-sxm", decode=5, context=500, graph_tokens=4)
