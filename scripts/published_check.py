"""batchsim against published end-to-end measurements of real serving engines.

Each case below is one published figure, with its source quoted in docs/fidelity.md
(section "Against published measurements"), mapped onto a batchsim scenario: the engine's
preset, the model, the GPU and tensor parallelism, the dtype, and the workload the
publication states. The shipped profiles and presets run unchanged: nothing here is
fitted, and no default may ever be tuned to these figures (they are how the project is
checked). Prints one row per case and the errors by metric.

    python scripts/published_check.py            # every case (about a minute)
    python scripts/published_check.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_parts, simulate

# (id, source, preset, model, hardware, tp, dtype, requests, isl, osl, load, metric, published)
# load: "all" = every request at t = 0 (trtllm-bench "infinite rate", vLLM's offline batch);
# metric: output_tok_s | batch_latency_ms (first arrival to last completion) | ttft_ms (one request)
CASES = [
    # TensorRT-LLM perf-overview, data of v0.14.0 (FP8, KV FP8), trtllm-bench at infinite rate
    ("M01", "S1", "trtllm", "llama-3.1-8b", "h200", 1, "fp8", 30000, 128, 128, "all", "output_tok_s", 27778.8885),
    ("M02", "S1", "trtllm", "llama-3.1-8b", "h100-sxm", 1, "fp8", 30000, 128, 128, "all", "output_tok_s", 26933.1886),
    ("M03", "S1", "trtllm", "llama-3.1-8b", "h100-sxm", 1, "fp8", 1500, 2048, 2048, "all", "output_tok_s", 8777.6623),
    ("M04", "S1", "trtllm", "llama-3.1-8b", "h200", 1, "fp8", 1500, 2048, 2048, "all", "output_tok_s", 11032.9729),
    ("M05", "S1", "trtllm", "llama-3.1-8b", "h100-sxm", 1, "fp8", 3000, 128, 2048, "all", "output_tok_s", 18995.2523),
    ("M06", "S1", "trtllm", "llama-3.1-8b", "h100-sxm", 1, "fp8", 3000, 2048, 128, "all", "output_tok_s", 3460.3545),
    ("M07", "S1", "trtllm", "llama-3.1-70b", "h100-sxm", 2, "fp8", 30000, 128, 128, "all", "output_tok_s", 5194.8171),
    ("M08", "S1", "trtllm", "llama-3.1-70b", "h100-sxm", 4, "fp8", 30000, 128, 128, "all", "output_tok_s", 8542.3012),
    ("M09", "S1", "trtllm", "llama-3.1-70b", "h200", 2, "fp8", 30000, 128, 128, "all", "output_tok_s", 5357.0227),
    ("M10", "S1", "trtllm", "llama-3.1-70b", "h100-sxm", 4, "fp8", 1500, 2048, 2048, "all", "output_tok_s", 4838.5272),
    ("M11", "S1", "trtllm", "llama-3.1-70b", "h200", 2, "fp8", 1500, 2048, 2048, "all", "output_tok_s", 3518.0774),
    ("M12", "S1", "trtllm", "llama-3.1-70b", "h100-sxm", 4, "fp8", 3000, 128, 2048, "all", "output_tok_s", 9017.4377),
    # TensorRT-LLM perf-overview, data of v0.9.0: batch-1 first-token latency on H200 (FP8)
    ("M23a", "S3", "trtllm", "llama-2-7b", "h200", 1, "fp8", 1, 128, 1, "all", "ttft_ms", 5.7),
    ("M23b", "S3", "trtllm", "llama-2-7b", "h200", 1, "fp8", 1, 2048, 1, "all", "ttft_ms", 30.2),
    ("M23c", "S3", "trtllm", "llama-2-70b", "h200", 4, "fp8", 1, 2048, 1, "all", "ttft_ms", 103.0),
    # vLLM's CI latency test: a batch of 8, 32 tokens in, 128 out (mean latency of the batch)
    ("M43", "S10", "vllm-v1", "llama-3.1-8b", "h200", 1, "bf16", 8, 32, 128, "all", "batch_latency_ms", 833.421),
    ("M45", "S10", "vllm-v1", "llama-3-70b", "h200", 4, "bf16", 8, 32, 128, "all", "batch_latency_ms", 2077.53),
    ("M46a", "S10", "vllm-v1", "llama-3.1-8b", "h100-sxm", 1, "bf16", 8, 32, 128, "all", "batch_latency_ms", 997.542),
    ("M46b", "S10", "vllm-v1", "llama-3-70b", "h100-sxm", 4, "bf16", 8, 32, 128, "all", "batch_latency_ms", 2444.47),
]


# KV cache dtype where the source states it: S1 "If you specify FP8 quantization, the KV cache will
# automatically be set to FP8 as well!"; elsewhere batchsim's auto (the activation dtype)
KV_DTYPE = {"S1": "fp8"}


def run_case(case) -> dict:
    cid, src, preset, model, hw, tp, dtype, n, isl, osl, load, metric, published = case
    raw = {"name": cid, "model": model, "hardware": hw, "tensor_parallel_size": tp, "dtype": dtype,
           "engine_preset": preset, "kv_cache_dtype": KV_DTYPE.get(src, "auto"),
           "workload": {"num_requests": n, "arrival": {"process": "constant", "rate": 1e9},
                        "prompt_tokens": {"dist": "fixed", "value": isl},
                        "output_tokens": {"dist": "fixed", "value": osl}}}
    sc = scenario_from_dict(raw, cid)
    t = time.perf_counter()
    r = simulate(sc, build_parts(sc))
    req = r.requests
    done = req[req["status"] == "completed"]
    if metric == "output_tok_s":
        value = float(r.summary["output_throughput"])
    elif metric == "ttft_ms":
        value = float(done["ttft"].median() * 1e3)
    else:
        value = float((done["completion"].max() - req["arrival"].min()) * 1e3)
    return {"id": cid, "source": src, "engine": preset, "model": model, "hardware": hw, "tp": tp, "dtype": dtype,
            "requests": n, "isl": isl, "osl": osl, "metric": metric, "published": published, "batchsim": value,
            "error": value / published - 1, "completed": len(done), "engine_ran": r.summary["engine"],
            "seconds": round(time.perf_counter() - t, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--only", help="comma-separated case ids")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    rows = [run_case(c) for c in CASES if only is None or c[0] in only]
    print(f"{'id':6} {'engine':8} {'model':14} {'hardware':9} tp {'dtype':5} {'isl/osl':>9} {'metric':17}"
          f" {'published':>10} {'batchsim':>10} {'error':>7}")
    for r in rows:
        print(f"{r['id']:6} {r['engine']:8} {r['model']:14} {r['hardware']:9} {r['tp']:2} {r['dtype']:5} "
              f"{r['isl']:>4}/{r['osl']:<4} {r['metric']:17} {r['published']:10.1f} {r['batchsim']:10.1f} "
              f"{r['error']:+7.1%}")
    for metric in dict.fromkeys(r["metric"] for r in rows):
        errs = [r["error"] for r in rows if r["metric"] == metric]
        print(f"{metric}: {len(errs)} cases, median error {statistics.median(errs):+.1%}, "
              f"median |error| {statistics.median(abs(e) for e in errs):.1%}, worst {max(errs, key=abs):+.1%}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
