"""Host time of the executor's attention calls per shape, with and without cuDNN attention;
then eager against CUDA-graph decode steps.

The H200 run of docs/validation.md had validation steps that took 4.5x the host
time of their neighbours (GPU idle, the host thread busy) in stretches tied to
the batch: padded batches of 4 and 8 rows ran fast, 3, 5 and 7 slow. The
leading suspect is an attention backend that builds a plan per new shape
(cuDNN SDPA; a decode step's context grows by one token every step). This
probe times ``decode_attention`` over growing contexts for batch sizes 1-8,
with cuDNN SDPA allowed and disallowed, and prints the median host time per
call: a per-shape plan build shows as milliseconds where the others take tens
of microseconds. Then it times whole decode steps of the reference executor's
model (``--model``; the symptom itself) the same way, so a cause outside
attention shows too.

Last, the same decode steps eager and on the executor's graph path
(:mod:`batchsim.calibrate.graphs`; replayed CUDA graphs on CUDA, the uncaptured
static layout on a CPU), batch by batch: median wall time, median host enqueue
time (until the host had queued the step) and the graph's capture time. A
device-bound step has an enqueue time far under its wall time. The two paths'
sampled tokens and logits are compared on every step too (bf16: a near tie may
flip an argmax, so this reports agreement, it does not assert it). ``--json``
writes these numbers.

    python scripts/sdpa_probe.py [--device cuda] [--steps 12] [--model llama-3-8b] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from batchsim.calibrate.executor import ReferenceModel, Row  # noqa: E402
from batchsim.calibrate.kernels import decode_attention, resolve_device, synchronize  # noqa: E402
from batchsim.calibrate.models import load_model  # noqa: E402


def probe(device: torch.device, batch: int, steps: int, start: int = 300) -> float:
    """Median host seconds of one decode_attention call as the context grows by one per call."""
    h, hk, dh, cap = 32, 8, 128, start + steps + 1
    kc = torch.randn(8, hk, cap, dh, device=device, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn(batch, h, dh, device=device, dtype=torch.bfloat16)
    slots = torch.arange(batch, device=device) % 8
    times = []
    for n in range(start, start + steps):
        lens = torch.full((batch,), n, device=device)
        synchronize(device)
        t0 = time.perf_counter()
        decode_attention(q, kc, vc, slots, lens, n)
        times.append(time.perf_counter() - t0)
        synchronize(device)
    return statistics.median(times)


def step_probe(model: ReferenceModel, batch: int, steps: int, start: int = 300) -> float:
    """Median wall seconds of a whole decode step of ``batch`` rows, the context growing by one."""
    model.reset()
    times = []
    for j in range(steps):
        rows = [Row(i, 1, start + j, 0, [1 + i]) for i in range(batch)]
        t0 = time.perf_counter()
        model.step(rows)  # (ends with a synchronize)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def graph_probe(model: ReferenceModel, batch: int, steps: int, start: int = 300) -> dict:
    """Eager against graph-path decode steps of ``batch`` rows, the context growing by one a step:
    median wall and enqueue seconds of each (the graph's first step, which captures, is left out
    and reported as ``capture_s``), tokens that agree, the largest logit difference."""
    model.reset()
    eager_wall, eager_enq, graph_wall, graph_enq = [], [], [], []
    agree = total = 0
    diff, capture, modes = 0.0, 0.0, set()
    for j in range(steps + 1):
        rows = [Row(i, 1, start + j, 0, [1 + i]) for i in range(batch)]
        runs = {}
        for path in ("eager", "graph"):
            model.graphs = path == "graph"
            t0 = time.perf_counter()
            out = model.step(rows)  # (ends with a synchronize; the KV it writes is the same either way)
            wall = time.perf_counter() - t0
            runs[path] = (out, {i: x.float().clone() for i, x in model.last_logits().items()})
            if path == "graph":
                modes.add(model.last_mode)
            if j == 0:
                capture = wall if path == "graph" and model.last_mode == "capture" else capture
                continue
            (eager_wall if path == "eager" else graph_wall).append(wall)
            (eager_enq if path == "eager" else graph_enq).append(model.enqueued - t0)
        agree += sum(a == b for a, b in zip(runs["eager"][0], runs["graph"][0]))
        total += batch
        (_, la), (_, lb) = runs["eager"], runs["graph"]
        diff = max([diff] + [float((la[i] - lb[i]).abs().max()) for i in la])
    model.graphs = True
    med = statistics.median
    return {"batch": batch, "eager_wall_s": med(eager_wall), "eager_enqueue_s": med(eager_enq),
            "graph_wall_s": med(graph_wall), "graph_enqueue_s": med(graph_enq), "capture_s": capture,
            "graph_modes": sorted(modes), "tokens_agree": agree, "tokens": total, "max_logit_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--model", default=None, help="model for whole steps (default llama-3-8b on cuda, tiny-llama on cpu)")
    ap.add_argument("--json", default=None, help="write the eager-against-graph numbers to this file")
    args = ap.parse_args()
    dev = resolve_device(args.device)
    settings = [("cudnn allowed", True), ("cudnn disallowed", False)] if dev.type == "cuda" else [("cpu", None)]
    print("decode_attention, host time per call:", flush=True)
    for label, cudnn in settings:
        if cudnn is not None:
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
        row = [f"B={b}: {probe(dev, b, args.steps) * 1e6:7.0f} us" for b in range(1, 9)]
        print(f"  {label:17s} " + "  ".join(row), flush=True)
    name = args.model or ("llama-3-8b" if dev.type == "cuda" else "tiny-llama")
    model = ReferenceModel(load_model(name), dev, "bf16", max_len=300 + 2 * args.steps + 8, slots=40, graphs=True)
    model.step([Row(None, 1, 1, 0)])  # (first use: kernels load)
    print(f"whole {name} decode steps, wall time per step:", flush=True)
    for label, cudnn in settings:
        if cudnn is not None:
            torch.backends.cuda.enable_cudnn_sdp(cudnn)  # (after ReferenceModel, which turns it off)
        model.graphs = False  # (eager, as the H200 run's steps were)
        row = [f"B={b}: {step_probe(model, b, args.steps) * 1e3:6.1f} ms" for b in range(1, 9)]
        print(f"  {label:17s} " + "  ".join(row), flush=True)
    if dev.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)  # (as the executor runs)
    graph = "CUDA graphs" if model.decode_graphs.capture else "static layout, uncaptured (no CUDA)"
    print(f"whole {name} decode steps, eager against the graph path ({graph}), median ms:", flush=True)
    print("      B   eager wall  eager enqueue   graph wall  graph enqueue   capture   tokens agree  max |dlogit|")
    results = []
    for b in (1, 4, 8, 16, 32):
        r = graph_probe(model, b, args.steps)
        results.append(r)
        print(f"  {b:5d} {r['eager_wall_s'] * 1e3:12.2f} {r['eager_enqueue_s'] * 1e3:14.2f} "
              f"{r['graph_wall_s'] * 1e3:12.2f} {r['graph_enqueue_s'] * 1e3:14.2f} {r['capture_s'] * 1e3:9.1f} "
              f"{r['tokens_agree']:8d}/{r['tokens']:<5d} {r['max_logit_diff']:12.3g}  {','.join(r['graph_modes'])}",
              flush=True)
    if model.decode_graphs.error:
        print(f"CUDA graph capture FAILED: {model.decode_graphs.error}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(dev), "model": name, "graph": graph,
                                               "capture_error": model.decode_graphs.error, "batches": results},
                                              indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
