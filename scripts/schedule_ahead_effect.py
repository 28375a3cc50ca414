"""What planning a step while the one before it runs (``schedule_ahead``) changes, preset by preset.

Runs each preset that plans ahead (vllm-v1, sglang, trtllm) as shipped and with
``schedule_ahead: false``, on one model, GPU and fixed request shape at several
Poisson rates and seeds, and prints mean TTFT, mean ITL and output throughput:
the median over the seeds, with their range. Nothing is compared with an engine here;
the table shows what the mechanism does (docs/fidelity.md, "What planning ahead changes").

    python scripts/schedule_ahead_effect.py                  # the table in docs/fidelity.md
    python scripts/schedule_ahead_effect.py --presets vllm-v1 --rates 4 16 --seeds 0
"""

from __future__ import annotations

import argparse
import statistics

from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_parts, simulate


def run(preset: str, ahead: bool, rate: float, seed: int, args) -> tuple[float, float, float]:
    raw = {"name": f"{preset}-{rate}-{seed}", "model": args.model, "hardware": args.hardware,
           "tensor_parallel_size": args.tp, "engine_preset": preset, "seed": seed,
           "policy": {"schedule_ahead": ahead},
           "workload": {"num_requests": args.requests, "arrival": {"process": "poisson", "rate": rate},
                        "prompt_tokens": {"dist": "fixed", "value": args.isl},
                        "output_tokens": {"dist": "fixed", "value": args.osl}}}
    sc = scenario_from_dict(raw, raw["name"])
    s = simulate(sc, build_parts(sc)).summary
    return float(s["mean_ttft_ms"]), float(s["mean_itl_ms"]), float(s["output_throughput"])


def cell(values: list[float], fmt: str) -> str:
    mid = statistics.median(values)
    if len(values) == 1:
        return format(mid, fmt)
    return f"{mid:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["vllm-v1", "sglang", "trtllm"])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--isl", type=int, default=467)
    ap.add_argument("--osl", type=int, default=256)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--rates", type=float, nargs="+", default=[2, 8, 16, 32])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    print(f"{args.model} on {args.hardware}, TP {args.tp}, {args.requests} requests of {args.isl}/{args.osl} "
          f"tokens, Poisson arrivals; seeds {args.seeds}: median (range)\n")
    print("| preset | req/s | schedule_ahead | mean TTFT ms | mean ITL ms | output tok/s | TTFT change |")
    print("|---|---|---|---|---|---|---|")
    for preset in args.presets:
        for rate in args.rates:
            rows = {}
            for ahead in (True, False):
                got = [run(preset, ahead, rate, seed, args) for seed in args.seeds]
                rows[ahead] = [list(col) for col in zip(*got)]
            base = statistics.median(rows[False][0])
            for ahead in (True, False):
                ttft, itl, tput = rows[ahead]
                change = f"{statistics.median(ttft) / base - 1:+.0%}" if ahead else ""
                print(f"| {preset} | {rate:g} | {'on (preset)' if ahead else 'off'} | {cell(ttft, '.1f')} | "
                      f"{cell(itl, '.2f')} | {cell(tput, ',.0f')} | {change} |")


if __name__ == "__main__":
    main()
