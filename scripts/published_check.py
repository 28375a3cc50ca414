"""batchsim against published end-to-end measurements of real serving engines.

Each case below is one published figure, with its source quoted in docs/fidelity.md
(section "Against published measurements"), mapped onto a batchsim scenario: the engine's
preset, the model, the GPU and tensor parallelism, the dtype, and the workload the
publication states. The shipped profiles and presets run unchanged: nothing here is
fitted, and no default may ever be tuned to these figures (they are how the project is
checked). Prints one row per case and the errors by metric.

    python scripts/published_check.py            # every case (a few minutes)
    python scripts/published_check.py --json out.json
    python scripts/published_check.py --only-source S2   # one source's cases

Cases under load (S2: arrivals at a stated request rate) run on SEEDS and report the median
over them with the range, so a row's error says how much of it the arrival draw alone can move.
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
    # the same table's Llama 3.1 70B 128/128 at every TP it gives (TP 2 and 4 on the H100 are M07/M08, TP 2 on
    # the H200 M09): how throughput per GPU falls with TP
    ("M13", "S1", "trtllm", "llama-3.1-70b", "h200", 1, "fp8", 30000, 128, 128, "all", "output_tok_s", 3897.2623),
    ("M14", "S1", "trtllm", "llama-3.1-70b", "h200", 4, "fp8", 30000, 128, 128, "all", "output_tok_s", 8826.9618),
    ("M15", "S1", "trtllm", "llama-3.1-70b", "h200", 8, "fp8", 30000, 128, 128, "all", "output_tok_s", 16382.9807),
    ("M16", "S1", "trtllm", "llama-3.1-70b", "h100-sxm", 8, "fp8", 30000, 128, 128, "all", "output_tok_s", 15533.1169),
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


# TensorRT-LLM perf-overview, data of v0.14.0, "Online Serving Measurements": the Triton
# TensorRT-LLM backend, "500 requests and BF16 precision"; per (model, GPU, TP, ISL, OSL) and QPS
# the published Mean TTFT (ms), Mean ITL (ms) and Output Tput (tok/s). QPS "INF" is every request
# at t = 0. Rows: (model, hardware, tp, isl, osl, [(qps, ttft_ms, itl_ms, output_tok_s), ...]).
SERVING = [
    ("llama-3.1-8b", "h100-sxm", 1, 467, 256, [(2, 23, 8, 504), (4, 24, 9, 929), (8, 26, 9, 1959), (16, 30, 11, 3765),
                                               (32, 50, 19, 6774), ("inf", 3335, 39, 9420)]),
    ("llama-3.1-8b", "h100-sxm", 1, 467, 16, [(2, 19, 7, 32), (4, 20, 7, 63), (8, 22, 7, 126), (16, 24, 8, 251),
                                              (32, 29, 10, 493), ("inf", 3280, 193, 1269)]),
    ("llama-3.1-8b", "h100-sxm", 1, 202, 214, [(2, 19, 7, 416), (4, 20, 8, 816), (8, 21, 9, 1568), (16, 23, 10, 2879),
                                               (32, 27, 11, 4825), ("inf", 1657, 21, 8291)]),
    ("llama-3.1-70b", "h100-sxm", 4, 467, 256, [(2, 62, 21, 498), (4, 68, 24, 973), (8, 92, 32, 1860),
                                                (16, 175, 66, 3164), (32, 1229, 86, 4083), ("inf", 9123, 85, 4103)]),
    ("llama-3.1-70b", "h100-sxm", 4, 467, 16, [(2, 53, 18, 28), (4, 58, 20, 63), (8, 71, 24, 126), (16, 109, 38, 248),
                                               (32, 1197, 482, 452), ("inf", 9126, 548, 454)]),
    ("llama-3.1-70b", "h100-sxm", 4, 202, 214, [(2, 48, 20, 401), (4, 51, 22, 771), (8, 57, 25, 1390),
                                                (16, 74, 32, 2245), (32, 116, 42, 3003), ("inf", 4482, 50, 3459)]),
    ("llama-3.1-70b", "h200", 4, 467, 256, [(2, 58, 18, 499), (4, 63, 20, 980), (8, 84, 27, 1886), (16, 165, 60, 3264),
                                            (32, 1279, 83, 4176), ("inf", 9222, 83, 4185)]),
    ("llama-3.1-70b", "h200", 4, 467, 16, [(2, 50, 15, 32), (4, 55, 16, 63), (8, 67, 20, 126), (16, 103, 33, 248),
                                           (32, 1259, 485, 450), ("inf", 9074, 546, 457)]),
    ("llama-3.1-70b", "h200", 4, 202, 214, [(2, 43, 17, 408), (4, 46, 18, 784), (8, 51, 21, 1438), (16, 67, 28, 2386),
                                            (32, 112, 39, 3235), ("inf", 4480, 48, 3719)]),
    ("llama-3.1-8b", "h200", 1, 467, 256, [(2, 21, 6, 504), (4, 23, 7, 1001), (8, 24, 7, 1971), (16, 27, 9, 3809),
                                           (32, 44, 16, 7025), ("inf", 3237, 36, 10121)]),
    ("llama-3.1-8b", "h200", 1, 467, 16, [(2, 18, 5, 32), (4, 19, 6, 63), (8, 20, 6, 126), (16, 22, 7, 250),
                                          (32, 27, 9, 494), ("inf", 3227, 190, 1291)]),
    ("llama-3.1-8b", "h200", 1, 202, 214, [(2, 17, 6, 418), (4, 18, 6, 822), (8, 19, 7, 1589), (16, 20, 8, 2969),
                                           (32, 24, 9, 5109), ("inf", 1665, 19, 9189)]),
]
SEEDS = (0, 1, 2)


def _serving_cases():
    out = []
    for model, hw, tp, isl, osl, points in SERVING:
        short = ("8b" if "8b" in model else "70b") + ("h1" if hw == "h100-sxm" else "h2")
        for qps, ttft, itl, tput in points:
            load = "all" if qps == "inf" else float(qps)
            tag = f"S2-{short}-{isl}/{osl}@{qps}"
            out += [(f"{tag}:ttft", "S2", "trtllm", model, hw, tp, "bf16", 500, isl, osl, load, "mean_ttft_ms", ttft),
                    (f"{tag}:itl", "S2", "trtllm", model, hw, tp, "bf16", 500, isl, osl, load, "mean_itl_ms", itl)]
            if qps == "inf":
                out.append((f"{tag}:tput", "S2", "trtllm", model, hw, tp, "bf16", 500, isl, osl, load,
                            "output_tok_s", tput))
    return out


CASES += _serving_cases()


# KV cache dtype where the source states it: S1 "If you specify FP8 quantization, the KV cache will
# automatically be set to FP8 as well!"; elsewhere batchsim's auto (the activation dtype)
KV_DTYPE = {"S1": "fp8"}


# The preset's knobs a source's engine does not share. TensorRT-LLM's figures (S1-S3) are of the TensorRT
# engine backend, whose C++ executor schedules a step only after the one before it has finished
# (Executor::Impl::executionLoop: forwardSync, responses, fetchNewRequests, forwardAsync); the trtllm
# preset is the PyTorch backend's, whose overlap scheduler plans ahead.
# Sources whose requests are all in the engine before its first step: vLLM's latency benchmark hands
# its batch to LLM.generate, which adds every request and then steps the engine. (Elsewhere "all" is
# a client sending at an unlimited rate: one request every nanosecond.)
AT_ONCE = {"S10"}
POLICY = {"S1": {"schedule_ahead": False}, "S2": {"schedule_ahead": False}, "S3": {"schedule_ahead": False}}


def _simulate(cid, src, preset, model, hw, tp, dtype, n, isl, osl, load, metric, seed):
    arrival = ({"process": "constant", "rate": 1e9} if load == "all" else {"process": "poisson", "rate": load})
    if load == "all" and src in AT_ONCE:  # (n clients at once: every request sent at t = 0)
        arrival = {"process": "closed", "concurrency": n}
    raw = {"name": cid, "model": model, "hardware": hw, "tensor_parallel_size": tp, "dtype": dtype,
           "engine_preset": preset, "kv_cache_dtype": KV_DTYPE.get(src, "auto"), "seed": seed,
           **({"policy": POLICY[src]} if src in POLICY else {}),
           "workload": {"num_requests": n, "arrival": arrival,
                        "prompt_tokens": {"dist": "fixed", "value": isl},
                        "output_tokens": {"dist": "fixed", "value": osl}}}
    sc = scenario_from_dict(raw, cid)
    r = simulate(sc, build_parts(sc))
    req = r.requests
    done = req[req["status"] == "completed"]
    if metric == "output_tok_s":
        value = float(r.summary["output_throughput"])
    elif metric == "ttft_ms":
        value = float(done["ttft"].median() * 1e3)
    elif metric in ("mean_ttft_ms", "mean_itl_ms"):
        value = float(r.summary[metric])
    else:
        value = float((done["completion"].max() - req["arrival"].min()) * 1e3)
    return value, len(done), r.summary["engine"]


def run_case(case) -> dict:
    """One case: every request at t = 0 runs once (it draws nothing); a case at a request rate runs
    on each of SEEDS and reports the median, with the lowest and highest seed's value."""
    cid, src, preset, model, hw, tp, dtype, n, isl, osl, load, metric, published = case
    t = time.perf_counter()
    runs = [_simulate(cid, src, preset, model, hw, tp, dtype, n, isl, osl, load, metric, seed)
            for seed in ((0,) if load == "all" else SEEDS)]
    values = sorted(v for v, _, _ in runs)
    value = statistics.median(values)
    return {"id": cid, "source": src, "engine": preset, "model": model, "hardware": hw, "tp": tp, "dtype": dtype,
            "requests": n, "isl": isl, "osl": osl, "load": load, "metric": metric, "published": published,
            "batchsim": value, "low": values[0], "high": values[-1], "seeds": len(runs),
            "error": value / published - 1, "completed": min(c for _, c, _ in runs),
            "engine_ran": runs[0][2], "seconds": round(time.perf_counter() - t, 2)}


def _band(r: dict) -> str:
    """The group a row is summarized in: its metric, and for a case under load how heavy the load."""
    if r["source"] != "S2":
        return r["metric"]
    if r["load"] == "all":
        return f"S2 {r['metric']} at QPS INF"
    return f"S2 {r['metric']} at QPS {'2-8' if r['load'] <= 8 else '16-32'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--only", help="comma-separated case ids")
    ap.add_argument("--only-source", help="comma-separated source ids (S1, S2, S3, S10)")
    ap.add_argument("--markdown", action="store_true", help="also print the S2 table of docs/fidelity.md")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    sources = set(args.only_source.split(",")) if args.only_source else None
    rows = [run_case(c) for c in CASES if (only is None or c[0] in only) and (sources is None or c[1] in sources)]
    print(f"{'id':24} {'engine':8} {'model':14} {'hardware':9} tp {'dtype':5} {'isl/osl':>9} {'metric':17}"
          f" {'published':>10} {'batchsim':>10} {'error':>7}  seeds' range")
    for r in rows:
        spread = f"  {r['low']:.1f}-{r['high']:.1f}" if r["seeds"] > 1 else ""
        print(f"{r['id']:24} {r['engine']:8} {r['model']:14} {r['hardware']:9} {r['tp']:2} {r['dtype']:5} "
              f"{r['isl']:>4}/{r['osl']:<4} {r['metric']:17} {r['published']:10.1f} {r['batchsim']:10.1f} "
              f"{r['error']:+7.1%}{spread}")
    for band in dict.fromkeys(_band(r) for r in rows):
        errs = [r["error"] for r in rows if _band(r) == band]
        print(f"{band}: {len(errs)} cases, median error {statistics.median(errs):+.1%}, "
              f"median |error| {statistics.median(abs(e) for e in errs):.1%}, worst {max(errs, key=abs):+.1%}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    if args.markdown:
        print()
        print(serving_markdown(rows))


def serving_markdown(rows: list[dict]) -> str:
    """docs/fidelity.md's table of the S2 cases: a row per deployment and load, TTFT and ITL side by side."""
    by: dict[str, dict[str, dict]] = {}
    for r in rows:
        if r["source"] == "S2":
            key, metric = r["id"].rsplit(":", 1)
            by.setdefault(key, {})[metric] = r
    out = ["| case | model | GPU | TP | ISL/OSL | QPS | TTFT ms published | batchsim (seeds' range) | error "
           "| ITL ms published | batchsim (seeds' range) | error |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, d in by.items():
        t, i = d["ttft"], d["itl"]
        qps = "INF" if t["load"] == "all" else f"{t['load']:g}"

        def cell(r):
            rng = f" ({r['low']:.1f}-{r['high']:.1f})" if r["seeds"] > 1 else ""
            return f"{r['published']:g} | {r['batchsim']:.1f}{rng} | {r['error']:+.0%}"
        out.append(f"| {key} | {t['model']} | {t['hardware']} | {t['tp']} | {t['isl']}/{t['osl']} | {qps} | "
                   f"{cell(t)} | {cell(i)} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
