"""Host time of the executor's attention calls per shape, with and without cuDNN attention.

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

    python scripts/sdpa_probe.py [--device cuda] [--steps 12] [--model llama-3-8b]
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--model", default=None, help="model for whole steps (default llama-3-8b on cuda, tiny-llama on cpu)")
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
    model = ReferenceModel(load_model(name), dev, "bf16", max_len=300 + 2 * args.steps + 8, slots=16)
    model.step([Row(None, 1, 1, 0)])  # (first use: kernels load)
    print(f"whole {name} decode steps, wall time per step:", flush=True)
    for label, cudnn in settings:
        if cudnn is not None:
            torch.backends.cuda.enable_cudnn_sdp(cudnn)  # (after ReferenceModel, which turns it off)
        row = [f"B={b}: {step_probe(model, b, args.steps) * 1e3:6.1f} ms" for b in range(1, 9)]
        print(f"  {label:17s} " + "  ".join(row), flush=True)


if __name__ == "__main__":
    main()
