"""The reference executor: a real KV-cached transformer driven by the simulator's own engine and policies."""

from __future__ import annotations

from functools import partial

import pytest

torch = pytest.importorskip("torch")

from batchsim.calibrate.executor import ReferenceModel, Row, phantom_rows  # noqa: E402
from batchsim.calibrate.replica import ExecutorReplica  # noqa: E402
from batchsim.calibrate.models import ModelSpec, load_model  # noqa: E402
from batchsim.app.config import scenario_from_dict  # noqa: E402
from batchsim.sim.errors import InputError  # noqa: E402
from batchsim.sim.records import REQUEST_COLUMNS  # noqa: E402
from batchsim.app.runner import build_parts, simulate  # noqa: E402
from batchsim.sim.types import StepShape  # noqa: E402

CPU = torch.device("cpu")
SMALL = ModelSpec(name="small", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=256, max_position_embeddings=512)


@pytest.mark.parametrize("pad", [False, True])
def test_chunked_prefill_and_decodes_match_one_whole_prefill(pad):
    m = ReferenceModel(SMALL, CPU, "fp32", max_len=128, slots=2, pad=pad)
    ids = [(7 * i + 3) % 256 for i in range(40)]
    whole = m.step([Row(1, 40, 0, 39, ids)])
    assert m.step([Row(2, 25, 0, None, ids[:25])]) == [None]
    chunked = m.step([Row(2, 15, 25, 14, ids[25:])])
    assert whole == chunked
    a, b = whole[0], chunked[0]
    for t in range(4):  # batched decodes of both, with a scratch row in between
        out = m.step([Row(1, 1, 40 + t, 0, [a]), Row(None, 6, 3, 5), Row(2, 1, 40 + t, 0, [b])])
        assert out[0] == out[2] and out[1] is not None
        a, b = out[0], out[2]
    assert sorted(m.slot_of) == [1, 2]
    m.reset()
    assert m.slot_of == {}


def test_slots_grow_on_demand_and_keep_contents():
    m = ReferenceModel(SMALL, CPU, "fp32", max_len=64, slots=1, pad=False)
    first = m.step([Row(1, 10, 0, 9, list(range(10)))])
    m.step([Row(k, 5, 0, 4, list(range(5))) for k in range(2, 6)])  # needs 5 slots: grows twice
    assert len(m.k_cache[0]) >= 5
    m.release([1])
    again = m.step([Row(1, 10, 0, 9, list(range(10)))])
    assert again == first


def test_unsupported_models_and_rows_are_input_errors():
    moe = load_model("mixtral-8x7b")
    with pytest.raises(InputError, match="dense gated"):
        ReferenceModel(moe, CPU, "fp32")
    m = ReferenceModel(SMALL, CPU, "fp32", max_len=16, slots=1)
    with pytest.raises(InputError, match="KV positions"):
        m.step([Row(None, 20, 0, 19)])


def test_profile_steps_times_every_kernel_of_every_layer():
    shapes = [StepShape.of([(1, 10)] * 3), StepShape.of([(8, 0), (4, 4)], sampled=1)]
    rows = phantom_rows(shapes[1])
    assert [(r.q, r.kv, r.sample_at) for r in rows] == [(8, 0, 7), (4, 4, None)]
    m = ReferenceModel(SMALL, CPU, "bf16", max_len=64, slots=2)
    m.warm_up(64, 4)
    walls, kernels = m.profile_steps(shapes, rounds=2, kernels=True)
    assert len(walls) == 2 and all(t > 0 for t in walls) and m.slot_of == {}
    dec, mixed = kernels
    layers = SMALL.num_hidden_layers
    assert len(dec["qkv_proj"]) == 2 * layers and len(dec["norms"]) == 2 * (2 * layers + 1)
    assert len(dec["embedding"]) == 2 and len(dec["lm_head"]) == 2 and "attention_prefill" not in dec
    assert len(mixed["attention_prefill"]) == 2 * 2 * layers  # two row groups per layer
    assert m.time_steps(shapes, rounds=1)[0] > 0
    m.reserve(2, 4096, shrink=True)  # a long prefill needs a longer slab, a short one shrinks it back
    assert m.cap == 4096 and len(m.k_cache[0]) == 2
    m.reserve(1, 16, shrink=True)
    assert m.cap == 16


def _scenario(policy: dict, tmp_path):
    cat = tmp_path / "small.yaml"
    cat.write_text(SMALL.model_dump_json())
    return scenario_from_dict({
        "name": "exec", "model": str(cat), "hardware": "h100-sxm", "policy": dict(policy, max_model_len=256),
        "seed": 1, "workload": {"num_requests": 12, "arrival": {"process": "poisson", "rate": 50.0},
                                "prompt_tokens": {"dist": "uniform", "min": 3, "max": 40},
                                "output_tokens": {"dist": "uniform", "min": 2, "max": 9}}})


POLICIES = [{"name": "static", "max_batch_size": 4}, {"name": "dynamic", "max_batch_size": 4},
            {"name": "continuous", "max_num_seqs": 4, "max_num_batched_tokens": 64},
            {"name": "chunked_prefill", "max_num_seqs": 4, "max_num_batched_tokens": 16}]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p["name"])
def test_executor_runs_every_policy_to_the_simulators_records(policy, tmp_path):
    sc = _scenario(policy, tmp_path)
    parts = build_parts(sc)
    model = ReferenceModel(SMALL, CPU, "bf16", max_len=64, slots=4)
    calls: list[list[Row]] = []
    real_step = model.step
    model.step = lambda rows: (calls.append(list(rows)), real_step(rows))[1]
    log: list = []
    run = simulate(sc, parts, replica=partial(ExecutorReplica, model=model, log=log))
    sim = simulate(sc, parts)
    assert list(run.requests.columns) == list(REQUEST_COLUMNS) == list(sim.requests.columns)
    assert (run.requests["status"] == "completed").all() and len(run.requests) == 12
    assert list(run.steps.columns) == list(sim.steps.columns) and len(run.steps) == len(log) == len(calls)
    assert (run.steps["end"] - run.steps["start"]).tolist() == pytest.approx([r.measured_s for r in log])
    assert model.slot_of == {} or set(model.slot_of) <= set(run.requests["rid"])
    assert (run.requests["generated_tokens"] == run.requests["output_tokens"]).all()
    if policy["name"] == "static":
        # a padded launch runs as one batch of equal rows of the longest prompt
        first = calls[0]
        assert len({(r.q, r.kv) for r in first}) == 1 and all(r.key is not None for r in first)
