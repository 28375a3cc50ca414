"""``batchsim cost`` data and table (batchsim.calibrate.report)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from batchsim.calibrate.hardware import PROFILE_DIR
from batchsim.calibrate.report import cost_report, render_cost_table
from batchsim.sim.errors import InputError


def test_json_has_the_documented_shape_and_adds_up():
    rep = cost_report("llama-3-8b", "h100-sxm", prefill=2048)
    json.dumps(rep)  # plain data
    assert set(rep["total"]) >= {"seconds", "flops", "bytes"}
    names = [o["name"] for o in rep["operators"]]
    assert names[:3] == ["embedding", "norms", "qkv_proj"]
    for name in ("attention", "o_proj", "mlp_gate_up", "mlp_down", "lm_head", "host"):
        assert name in names
    assert "allreduce" not in names
    for op in rep["operators"]:
        assert set(op) == {"name", "seconds", "flops", "bytes", "bound"}
    assert sum(o["seconds"] for o in rep["operators"]) == pytest.approx(rep["total"]["seconds"])
    assert sum(o["flops"] for o in rep["operators"]) == pytest.approx(rep["total"]["flops"])
    assert isinstance(rep["kv_capacity_tokens"], int) and rep["kv_capacity_tokens"] > 0
    assert {o["name"]: o["bound"] for o in rep["operators"]}["mlp_gate_up"] == "compute"


def test_decode_with_tp_shows_allreduce_and_memory_bound_gemms():
    rep = cost_report("llama-3-70b", "h100-sxm", tp=4, decode=16, context=2000)
    ops = {o["name"]: o for o in rep["operators"]}
    assert ops["allreduce"]["bound"] == "network" and ops["mlp_gate_up"]["bound"] == "memory"
    assert rep["step"] == {"prefill_tokens": 0, "decode_batch": 16, "context": 2000, "tokens": 16, "sampled": 16}


def test_catalog_names_or_paths(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
                                "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
                                "max_position_embeddings": 131072, "tie_word_embeddings": True}))
    rep = cost_report(str(path), str(PROFILE_DIR / "l4.yaml"), decode=4, context=100)
    assert rep["hardware"] == "l4" and rep["model"] == tmp_path.name


def test_weights_that_do_not_fit_still_price_the_step():
    rep = cost_report("llama-3.1-405b", "h100-sxm", decode=1, context=10)
    assert rep["kv_capacity_tokens"] is None and "does not fit" in rep["kv_capacity_error"]
    assert rep["total"]["seconds"] > 0


@pytest.mark.parametrize("kw, msg", [
    ({}, "nothing to price"),
    ({"decode": 8}, "--context"),
    ({"prefill": 10, "context": 5}, "--context only"),
    ({"prefill": 10, "dtype": "fp4"}, "fp4"),
])
def test_bad_requests_are_input_errors(kw, msg):
    with pytest.raises(InputError, match=msg):
        cost_report("llama-3-8b", "h100-sxm", **kw)


def test_table_renders_operators_totals_and_kv_capacity():
    rep = cost_report("mixtral-8x7b", "a100-80gb", tp=2, prefill=512, decode=8, context=1000)
    out = Console(width=160, record=True)
    out.print(render_cost_table(rep))
    text = out.export_text()
    for part in ("moe_gate_up", "attention", "allreduce", "total", "KV capacity", "tokens per replica",
                 "datasheet, uncalibrated"):
        assert part in text
