"""``batchsim cost``: price one step operator by operator, as data and as a table.

:func:`cost_report` builds the step (a prefill of N tokens and/or a decode
batch at a given context), prices it with the breakdown, and returns plain
JSON-ready data; :func:`render_cost_table` turns that into a rich table. The
CLI only parses flags and calls these two.
"""

from __future__ import annotations

import dataclasses

from typing import Any

from rich.table import Table

from batchsim.calibrate.costmodel import RooflineCostModel
from batchsim.calibrate.hardware import load_hardware
from batchsim.calibrate.models import load_model
from batchsim.sim.errors import InputError
from batchsim.sim.types import StepShape

__all__ = ["cost_report", "render_cost_table", "step_shape"]


def step_shape(prefill: int | None, decode: int | None, context: int | None) -> StepShape:
    """One prefill row of ``prefill`` tokens plus ``decode`` rows at ``context`` tokens each."""
    if not prefill and not decode:
        raise InputError("nothing to price: give --prefill TOKENS and/or --decode BATCH --context LEN")
    if decode and (context is None or context < 1):
        raise InputError(f"--decode needs --context LEN >= 1 (tokens already cached per sequence), got {context}")
    if context is not None and not decode:
        raise InputError("--context only applies to --decode BATCH")
    if (prefill is not None and prefill < 0) or (decode is not None and decode < 0):
        raise InputError("--prefill and --decode must be positive")
    rows = ([(prefill, 0)] if prefill else []) + [(1, context)] * (decode or 0)
    return StepShape.of(rows)


def cost_report(model: str, hardware: str, tp: int = 1, dtype: str = "bf16", prefill: int | None = None,
                decode: int | None = None, context: int | None = None,
                gpu_memory_utilization: float = 0.9, graph_tokens: int | None = None) -> dict[str, Any]:
    """Price one step; the JSON that ``batchsim cost --json`` prints.

    Keys: ``total`` (seconds, flops, bytes and the compute/memory/network/
    overhead split), ``operators`` (name, seconds, flops, bytes, bound; each
    summed over all layers of the replica), ``kv_capacity_tokens`` (None when
    the weights do not fit, with the reason in ``kv_capacity_error``), and
    context: model, hardware, tp, dtypes, the step, MFU/MBU of the step. With ``graph_tokens``
    the step is replayed from a CUDA graph captured at that many tokens: the dense operators run
    at it, attention and the LM head on the real rows (as a run prices a padded step), and MFU
    counts the real tokens' FLOPs (``useful_flops``).
    """
    spec, hw = load_model(model), load_hardware(hardware)
    cm = RooflineCostModel(spec, hw, tp=tp, dtype=dtype)
    shape = step_shape(prefill, decode, context)
    useful = None
    if graph_tokens is not None:
        if graph_tokens < shape.num_tokens:
            raise InputError(f"--graph-tokens {graph_tokens} is below the step's {shape.num_tokens} tokens: "
                             "a step replays a graph captured at least as large as itself")
        useful = cm.price(shape).flops
        shape = dataclasses.replace(shape, dense_tokens=graph_tokens)
    cost = cm.price(shape, breakdown=True)
    useful = cost.flops if useful is None else useful
    try:
        kv_tokens, kv_error = cm.kv_capacity_tokens(gpu_memory_utilization), None
    except InputError as e:  # (this command's option for the deployment's size is --tp)
        kv_tokens, kv_error = None, str(e).replace("raise tensor_parallel_size", "raise --tp")
    ops = [{"name": o.name, "seconds": o.seconds, "flops": o.flops, "bytes": o.bytes, "bound": o.bound}
           for o in cost.breakdown or ()]
    return {
        "model": spec.name, "hardware": hw.name, "calibrated": hw.calibrated, "tp": tp,
        "dtype": cm.dtype, "kv_dtype": cm.kv_dtype, "compute_dtype": cm.compute_dtype,
        "step": {"prefill_tokens": prefill or 0, "decode_batch": decode or 0, "context": context or 0,
                 "tokens": shape.num_tokens, "sampled": shape.sampled,
                 **({"graph_tokens": graph_tokens} if graph_tokens is not None else {})},
        "total": {"seconds": cost.seconds, "flops": cost.flops, "bytes": cost.bytes,
                  "compute_s": cost.compute_s, "memory_s": cost.memory_s, "network_s": cost.network_s,
                  "overhead_s": cost.overhead_s, "out_of_range": cost.out_of_range},
        "useful_flops": useful,
        "mfu": useful / (cost.seconds * cm.peak_flops),
        "mbu": cost.bytes / (cost.seconds * cm.peak_bandwidth),
        "operators": ops,
        "weight_bytes_per_gpu": cm.weight_bytes_per_gpu,
        "kv_bytes_per_token": cm.kv_bytes_per_token,
        "gpu_memory_utilization": gpu_memory_utilization,
        "kv_capacity_tokens": kv_tokens,
        "kv_capacity_error": kv_error,
    }


def _time(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def render_cost_table(report: dict[str, Any]) -> Table:
    """A rich table of the operators and the totals, with the KV capacity underneath."""
    step = report["step"]
    what = " + ".join(p for p in (
        f"prefill {step['prefill_tokens']}" if step["prefill_tokens"] else "",
        f"decode {step['decode_batch']} x ctx {step['context']}" if step["decode_batch"] else "") if p)
    if step.get("graph_tokens", 0) > step["tokens"]:
        what += f", replayed from a CUDA graph of {step['graph_tokens']} tokens"
    tag = "calibrated" if report["calibrated"] else "datasheet, uncalibrated"
    table = Table(title=f"{report['model']} on {report['hardware']} (tp={report['tp']}, {report['dtype']}, "
                        f"{tag}): {what}")
    for col, justify in (("operator", "left"), ("GFLOP", "right"), ("MB", "right"), ("time", "right"),
                         ("share", "right"), ("bound", "left")):
        table.add_column(col, justify=justify)
    total = report["total"]
    for op in report["operators"]:
        table.add_row(op["name"], f"{op['flops'] / 1e9:,.2f}", f"{op['bytes'] / 1e6:,.1f}", _time(op["seconds"]),
                      f"{op['seconds'] / total['seconds']:.1%}", op["bound"])
    table.add_section()
    table.add_row("total", f"{total['flops'] / 1e9:,.2f}", f"{total['bytes'] / 1e6:,.1f}",
                  _time(total["seconds"]), "100%", "")
    kv = report["kv_capacity_tokens"]
    kv_line = (f"KV capacity: {kv:,} tokens per replica at gpu_memory_utilization="
               f"{report['gpu_memory_utilization']:g}" if kv is not None else f"KV capacity: {report['kv_capacity_error']}")
    split = (f"compute-bound {_time(total['compute_s'])}, memory-bound {_time(total['memory_s'])}, "
             f"network {_time(total['network_s'])}, overhead {_time(total['overhead_s'])}")
    table.caption = (f"{split}\n{kv_line}; weights {report['weight_bytes_per_gpu'] / 2**30:.1f} GiB per GPU; "
                     f"MFU {report['mfu']:.1%}, MBU {report['mbu']:.1%}"
                     + (f"; {total['out_of_range']} operators outside the calibrated range"
                        if total["out_of_range"] else ""))
    return table
