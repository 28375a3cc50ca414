"""What one mechanism of the engine presets changes, preset by preset.

Runs each preset as shipped and with one knob turned off (``schedule_ahead: false``, planning
each step while the one before it runs; ``cuda_graphs: null``, padding steps to CUDA-graph
capture sizes), on one model, GPU and fixed request shape at several Poisson rates and seeds,
and prints mean TTFT, mean ITL and output throughput: the median over the seeds, with their
range. Nothing is compared with an engine here; the tables show what the mechanism does
(docs/fidelity.md, "What planning ahead changes" and "What CUDA-graph padding changes").

    python scripts/knob_effect.py                  # planning ahead: the table in docs/fidelity.md
    python scripts/knob_effect.py --knob cuda_graphs --presets vllm-v1 sglang
    python scripts/knob_effect.py --presets vllm-v1 --rates 4 16 --seeds 0
"""

from __future__ import annotations

import argparse
import statistics

from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_parts, simulate


OFF = {"schedule_ahead": False, "cuda_graphs": None}  # each knob's value when the mechanism is off


def run(preset: str, on: bool, rate: float, seed: int, args) -> tuple[float, float, float]:
    raw = {"name": f"{preset}-{rate}-{seed}", "model": args.model, "hardware": args.hardware,
           "tensor_parallel_size": args.tp, "engine_preset": preset, "seed": seed,
           "policy": {} if on else {args.knob: OFF[args.knob]},
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


def pct(x: float) -> str:
    return "0.0%" if abs(x) < 0.0005 else f"{x:+.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--knob", choices=sorted(OFF), default="schedule_ahead", help="the mechanism to turn off")
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
    print(f"| preset | req/s | {args.knob} | mean TTFT ms | mean ITL ms | output tok/s | TTFT change | "
          "ITL change |")
    print("|---|---|---|---|---|---|---|---|")
    for preset in args.presets:
        for rate in args.rates:
            rows = {}
            for on in (True, False):
                got = [run(preset, on, rate, seed, args) for seed in args.seeds]
                rows[on] = [list(col) for col in zip(*got)]
            base_ttft, base_itl = statistics.median(rows[False][0]), statistics.median(rows[False][1])
            for on in (True, False):
                ttft, itl, tput = rows[on]
                change = (f"{pct(statistics.median(ttft) / base_ttft - 1)} | "
                          f"{pct(statistics.median(itl) / base_itl - 1)}") if on else " | "
                print(f"| {preset} | {rate:g} | {'on (preset)' if on else 'off'} | {cell(ttft, '.1f')} | "
                      f"{cell(itl, '.2f')} | {cell(tput, ',.0f')} | {change} |")


if __name__ == "__main__":
    main()
