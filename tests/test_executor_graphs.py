"""The reference executor's graph path: static-shape decode steps, CUDA-graph capture and replay.

On a CPU the static layout runs eagerly (mode "static"): these tests check that it
computes what the eager path computes (same sampled tokens, logits and KV in
fp32) across capture sizes, KV buckets, padding rows and rows that finish. The
``gpu`` tests capture and replay real CUDA graphs and skip without CUDA.
"""

from __future__ import annotations

from functools import partial

import pytest

torch = pytest.importorskip("torch")

from batchsim.calibrate.executor import ReferenceModel, Row, phantom_rows  # noqa: E402
from batchsim.calibrate.graphs import (CAPTURE_SIZES, KV_MIN, capture_size, decode_key, kv_bucket,  # noqa: E402
                                       kv_buckets)
from batchsim.calibrate.models import ModelSpec  # noqa: E402
from batchsim.calibrate.replica import ExecutorReplica  # noqa: E402
from batchsim.app.runner import build_parts, simulate  # noqa: E402
from batchsim.sim.types import StepShape  # noqa: E402
from tests.test_executor import _scenario  # noqa: E402

CPU = torch.device("cpu")
SMALL = ModelSpec(name="small", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=256, max_position_embeddings=512)
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_capture_sizes_are_vllms_defaults_and_a_batch_takes_the_smallest_that_holds_it():
    assert CAPTURE_SIZES[:5] == (1, 2, 4, 8, 16) and CAPTURE_SIZES[-1] == 512 and len(CAPTURE_SIZES) == 3 + 31 + 17
    assert 248 in CAPTURE_SIZES and 256 in CAPTURE_SIZES and 264 not in CAPTURE_SIZES and 272 in CAPTURE_SIZES
    assert [capture_size(b) for b in (1, 2, 3, 5, 9, 17, 250, 257, 512)] == [1, 2, 4, 8, 16, 24, 256, 272, 512]
    assert capture_size(513) is None


@pytest.mark.parametrize("cap", [12, 64, 392, 4096])
def test_kv_buckets_cover_every_context_with_a_bounded_over_read(cap):
    prev = 0
    for n in range(1, cap + 1):
        b = kv_bucket(n, cap)
        assert n <= b <= cap and b >= prev and kv_bucket(b, cap) == b
        assert b == cap or b <= max(KV_MIN, n + n // 8), (n, b)
        prev = b
    assert kv_buckets(cap) == sorted({kv_bucket(n, cap) for n in range(1, cap + 1)})
    if cap == 392:  # (the count docs/validation.md and the grid's NOTE give for a validation run)
        assert len(kv_buckets(cap)) == 38


def test_only_pure_decode_steps_that_fit_take_the_static_path():
    dec = [Row(1, 1, 30, 0), Row(2, 1, 17, 0), Row(None, 1, 5, None)]
    assert decode_key(dec, 128) == (4, kv_bucket(31, 128)) == (4, 32)
    assert decode_key(dec + [Row(3, 4, 0, 3)], 128) is None  # a prefill row: the step runs eager
    assert decode_key([Row(1, 2, 30, 1)], 128) is None  # two new tokens (a chunk)
    assert decode_key([Row(1, 1, 0, 0)], 128) is None  # a one-token prompt is a prefill
    assert decode_key([Row(1, 1, 127, 0)], 128) == (1, 128) and decode_key([Row(1, 1, 128, 0)], 128) is None
    assert decode_key([Row(i, 1, 3, 0) for i in range(513)], 128) is None  # past the largest capture size
    assert decode_key([], 128) is None


def _pair(**kw):
    """An eager model and one with the graph path, same weights."""
    eager = ReferenceModel(SMALL, kw.pop("device", CPU), "fp32", graphs=False, **kw)
    graph = ReferenceModel(SMALL, eager.device, "fp32", graphs=True, **kw)
    return eager, graph


def _same_step(eager, graph, rows, mode):
    """Run ``rows`` on both; the graph model ran in ``mode`` and computed what the eager one did."""
    a, b = eager.step(rows), graph.step(rows)
    assert eager.last_mode == "eager" and graph.last_mode == mode
    assert a == b
    la, lb = eager.last_logits(), graph.last_logits()
    assert sorted(la) == sorted(lb) == [i for i, r in enumerate(rows) if r.sample_at is not None]
    for i in la:
        torch.testing.assert_close(lb[i], la[i], rtol=1e-4, atol=1e-4)
    return a


def _same_kv(eager, graph, key, upto):
    """Both models hold the same keys and values for sequence ``key`` at positions < ``upto``."""
    se, sg = eager.slot_of[key], graph.slot_of[key]
    for caches in ("k_cache", "v_cache"):
        for ce, cg in zip(getattr(eager, caches), getattr(graph, caches)):
            torch.testing.assert_close(cg[sg, :, :upto], ce[se, :, :upto], rtol=1e-4, atol=1e-4)


def _decode_run(eager, graph, prompts, steps, mode, finish_at=None):
    """Prefill every prompt (eager on both), then ``steps`` decode steps of every live row;
    the row ``finish_at`` = (step, index) names leaves there (its slot released)."""
    toks = {}
    for k, n in prompts.items():
        out = _same_step(eager, graph, [Row(k, n, 0, n - 1, [(k * 31 + i) % 256 for i in range(n)])], "eager")
        toks[k] = out[0]
    ctx = dict(prompts)
    keys_seen = set()
    for t in range(steps):
        if finish_at and t == finish_at[0]:
            gone = sorted(toks)[finish_at[1]]
            del toks[gone]
            eager.release([gone])
            graph.release([gone])
        rows = [Row(k, 1, ctx[k], 0, [toks[k]]) for k in sorted(toks)]
        keys_seen.add(decode_key(rows, graph.cap))
        out = _same_step(eager, graph, rows, mode)
        for k, tok in zip(sorted(toks), out):
            toks[k] = tok
            ctx[k] += 1
    for k in toks:
        _same_kv(eager, graph, k, ctx[k])
    return keys_seen


@pytest.mark.parametrize("batch", [1, 3, 8, 9, 17])
def test_static_decode_steps_compute_what_eager_ones_do(batch):
    eager, graph = _pair(max_len=96, slots=4)  # (4 slots: the larger batches grow the slabs mid-run)
    prompts = {k: 12 + 3 * k for k in range(batch)}  # contexts from 13 up, across bucket edges (16, 18, 20 ...)
    keys = _decode_run(eager, graph, prompts, steps=10, mode="static")
    assert {p for p, _ in keys} == {capture_size(batch)} and len({kv for _, kv in keys}) >= 2  # (a bucket edge)


def test_a_row_finishing_mid_run_shrinks_the_padded_batch():
    eager, graph = _pair(max_len=64, slots=16)
    keys = _decode_run(eager, graph, {k: 5 + k for k in range(9)}, steps=8, mode="static", finish_at=(4, 2))
    assert {p for p, _ in keys} == {16, 8}  # 9 rows, then 8: no padding row left


def test_scratch_rows_and_padding_free_their_slots():
    eager, graph = _pair(max_len=64, slots=8)
    rows = phantom_rows(StepShape.of([(1, 20), (1, 31), (1, 7)], sampled=2))
    assert [r.sample_at for r in rows] == [0, 0, None]
    _same_step(eager, graph, rows, "static")
    free = len(graph.free)
    _same_step(eager, graph, rows, "static")
    assert len(graph.free) == free and graph.slot_of == {}  # the scratch rows' slots came back
    pad = graph.pad_slot()
    assert pad not in graph.free and graph.slot(None) != pad  # the pad slot stays held


def test_records_say_which_steps_took_the_static_path(tmp_path):
    sc = _scenario({"name": "continuous", "max_num_seqs": 4, "max_num_batched_tokens": 64}, tmp_path)
    parts = build_parts(sc)
    for graphs in (False, True):
        model = ReferenceModel(SMALL, CPU, "bf16", max_len=64, slots=8, graphs=graphs)
        decode: list[bool] = []
        real_step = model.step
        model.step = lambda rows: (decode.append(all(r.q == 1 and r.kv > 0 for r in rows)), real_step(rows))[1]
        log: list = []
        simulate(sc, parts, replica=partial(ExecutorReplica, model=model, log=log))
        want = ["static" if graphs and d else "eager" for d in decode]
        assert [r.mode for r in log] == want and (not graphs or {"static", "eager"} <= set(want))


def test_calibration_steps_record_their_mode():
    model = ReferenceModel(SMALL, CPU, "bf16", max_len=64, slots=2, graphs=True)
    shapes = [StepShape.of([(1, 10)] * 3), StepShape.of([(8, 0)]), StepShape.of([(4, 0), (1, 9)])]
    walls, _ = model.profile_steps(shapes, rounds=2, kernels=True)
    assert len(walls) == 3 and model.step_modes == ["static", "eager", "eager"]
    assert model.capture_decodes(4) == 0  # (no CUDA graphs on a CPU)


# -- on a GPU -------------------------------------------------------------------------
CUDA = torch.device("cuda") if torch.cuda.is_available() else None


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("batch", [1, 3, 9])
def test_gpu_graph_replays_compute_what_eager_steps_do(batch):
    eager, graph = _pair(device=CUDA, max_len=96, slots=32)
    prompts = {k: 12 + 3 * k for k in range(batch)}
    toks = {}
    for k, n in prompts.items():
        toks[k] = _same_step(eager, graph, [Row(k, n, 0, n - 1, [(k * 31 + i) % 256 for i in range(n)])],
                             "eager")[0]
    seen: set = set()
    for t in range(12):
        rows = [Row(k, 1, prompts[k] + t, 0, [toks[k]]) for k in sorted(toks)]
        key = decode_key(rows, graph.cap)
        out = _same_step(eager, graph, rows, "graph" if key in seen else "capture")
        seen.add(key)
        toks = dict(zip(sorted(toks), out))
    assert len(seen) >= 2 and graph.decode_graphs.captured == len(seen)
    for k in toks:  # the graphs wrote the KV of every step into the persistent slabs
        _same_kv(eager, graph, k, prompts[k] + 12)


@pytest.mark.gpu
@gpu
def test_gpu_growing_the_slabs_drops_the_graphs_and_recaptures():
    eager, graph = _pair(device=CUDA, max_len=64, slots=4)
    prompts = {k: 10 + k for k in range(3)}
    toks = {k: _same_step(eager, graph, [Row(k, n, 0, n - 1, [k + 1] * n)], "eager")[0] for k, n in prompts.items()}
    modes = []
    for t in range(4):
        if t == 2:  # more sequences than slots: the slabs double, every graph's pointers go stale
            for model in (eager, graph):
                model.step([Row(10 + j, 3, 0, 2, [1, 2, 3]) for j in range(4)])
        rows = [Row(k, 1, prompts[k] + t, 0, [toks[k]]) for k in sorted(toks)]
        a, b = eager.step(rows), graph.step(rows)
        assert a == b
        modes.append(graph.last_mode)
        toks = dict(zip(sorted(toks), a))
    assert modes == ["capture", "graph", "capture", "graph"]


@pytest.mark.gpu
@gpu
def test_gpu_warm_up_captures_every_decode_graph_a_run_can_meet():
    model = ReferenceModel(SMALL, CUDA, "bf16", max_len=48, slots=4)
    assert model.graphs  # (on by default on CUDA)
    n = model.capture_decodes(5)
    assert n == 4 * len(kv_buckets(48))  # sizes 1, 2, 4, 8
    rows = [Row(None, 1, kv, 0) for kv in (3, 20, 40)]
    model.step(rows)
    assert model.last_mode == "graph" and model.decode_graphs.captured == n


def test_calibration_evidence_keeps_how_each_whole_step_ran(tmp_path):
    from batchsim.app.validate import fit_calibration, read_evidence, write_evidence

    samples, facts = read_evidence("docs/validation-h200/calibration")  # (recorded eager: no modes)
    old = fit_calibration(samples, dict(facts))
    assert "eager PyTorch" in old.profile.provenance["host_overhead"] and "mode" not in old.host_steps[0]
    modes = ["graph" if decode_key(phantom_rows(s), 1 << 20) else "eager" for s, _, _ in facts["steps"]]
    g = {"graphs": True, "capture": True, "captured": 7, "capture_s": 0.25, "steps": {"eager": 1, "graph": 2}}
    cal = fit_calibration(samples, dict(facts, step_modes=modes, graphs=g))
    assert "replayed from CUDA graphs" in cal.profile.provenance["host_overhead"]
    assert "replayed from CUDA graphs" in cal.profile.description
    assert cal.profile.provenance["calibration"]["executor_steps"] == g
    assert [s["mode"] for s in cal.host_steps] == modes and {"graph", "eager"} <= set(modes)
    write_evidence(cal, tmp_path)
    again, back = read_evidence(tmp_path)
    assert back["step_modes"] == modes and back["graphs"] == g
    assert fit_calibration(again, back).profile.provenance == cal.profile.provenance


def test_validate_outputs_say_how_each_step_ran(tmp_path):
    import json

    import pandas as pd

    from batchsim.app.validate import validate, write_validation

    v = validate("cpu", "batchsim/calibrate/profiles/h200-bf16.yaml", model="tiny-llama", policies=["continuous"],
                 requests=4, rate=20.0, step_repeats=1, graphs=True)
    g = v.meta["executor_steps"]
    assert g["graphs"] is True and g["capture"] is False and g["captured"] == g["captured_at_warm_up"] == 0
    modes = [r.mode for r in v.logs["continuous"]]
    assert v.steps["continuous"]["modes"] == g["steps"] == {m: modes.count(m) for m in ("eager", "static")}
    write_validation(v, tmp_path)
    steps = pd.read_csv(tmp_path / "continuous" / "executor_steps.csv")
    assert steps["mode"].tolist() == modes
    assert pd.read_csv(tmp_path / "continuous" / "executor_step_times.csv")["mode"].tolist() == modes
    assert json.loads((tmp_path / "validate.json").read_text())["meta"]["executor_steps"] == g
