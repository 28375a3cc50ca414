"""Host time of the executor's attention calls per shape, with and without cuDNN attention.

The H200 run of docs/validation.md had validation steps that took 4.5x the host
time of their neighbours (GPU idle, the host thread busy) in stretches tied to
the batch: padded batches of 4 and 8 rows ran fast, 3, 5 and 7 slow. The
leading suspect is an attention backend that builds a plan per new shape
(cuDNN SDPA; a decode step's context grows by one token every step). This
probe times ``decode_attention`` over growing contexts for batch sizes 1-8,
with cuDNN SDPA allowed and disallowed, and prints the median host time per
call: a per-shape plan build shows as milliseconds where the others take tens
of microseconds.

    python scripts/sdpa_probe.py [--device cuda] [--steps 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from calibrate.kernels import decode_attention, resolve_device, synchronize  # noqa: E402


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    dev = resolve_device(args.device)
    settings = [("cudnn allowed", True), ("cudnn disallowed", False)] if dev.type == "cuda" else [("cpu", None)]
    for label, cudnn in settings:
        if cudnn is not None:
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
        row = [f"B={b}: {probe(dev, b, args.steps) * 1e6:7.0f} us" for b in range(1, 9)]
        print(f"{label:17s} " + "  ".join(row), flush=True)


if __name__ == "__main__":
    main()
