"""Disaggregated vs colocated serving on a long-prompt workload, load per GPU on the x axis.

    python -m bench.disagg_compare [--scenario examples/disagg-1p1d.yaml] [--png docs/disaggregation-compare.png]

Runs the scenario's workload through colocated continuous batching and chunked prefill (one GPU)
and through its disaggregated deployment (its pools' GPUs), at the same arrival rate per GPU, and
prints one markdown row per (deployment, rate): p90 TTFT and TPOT, the 1P1D run's TTFT split and
each pool's busy fraction. The figure shows p90 TTFT and TPOT against req/s per GPU, with the
scenario's SLOs: where each curve crosses its SLO is that deployment's goodput per GPU. One seed
per point (the scenario's); `batchsim plan --disagg` gives capacities with intervals.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from batchsim.app.compare import scenario_data
from batchsim.app.config import load_scenario, scenario_from_dict
from batchsim.app.runner import run_scenario


def variants(data: dict) -> dict[str, tuple[dict, int]]:
    """name -> (scenario data, GPUs): the disaggregated deployment and the two colocated policies."""
    d = data["disaggregation"]
    gpus = sum(int(d.get(p, {}).get("replicas", 1)) * int(d.get(p, {}).get("tensor_parallel_size") or
                                                           data.get("tensor_parallel_size", 1)) for p in ("prefill", "decode"))
    x, y = (int(d.get(p, {}).get("replicas", 1)) for p in ("prefill", "decode"))
    out = {f"{x}P{y}D": (data, gpus)}
    for policy in ("continuous", "chunked_prefill"):
        colo = {k: v for k, v in data.items() if k != "disaggregation"}
        colo["policy"] = {**data.get("policy", {}), "name": policy}
        out[f"colocated {policy}"] = (colo, int(data.get("tensor_parallel_size", 1)))
    return out


def run(data: dict, rate: float) -> dict:
    point = {**data, "workload": {**data["workload"], "arrival": {**data["workload"]["arrival"], "rate": rate}}}
    return run_scenario(scenario_from_dict(point, "point"), keep_steps=False).summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="examples/disagg-1p1d.yaml")
    ap.add_argument("--rates", default="1,2,3,3.5,4,4.5,5,6", help="req/s per GPU")
    ap.add_argument("--png", default=None, help="write the figure here")
    ap.add_argument("--ttft-slo", default=None, help="p90 TTFT limits (ms) to draw, comma-separated (default: the scenario's)")
    ap.add_argument("--tpot-slo", default=None, help="p90 TPOT limits (ms) to draw, comma-separated (default: the scenario's)")
    args = ap.parse_args(argv)
    sc = load_scenario(args.scenario)
    data = scenario_data(sc)
    slo = sc.slo.limits()
    lines = {k: ([float(v) for v in given.split(",")] if given else ([slo[k]] if k in slo else []))
             for k, given in (("ttft_ms", args.ttft_slo), ("tpot_ms", args.tpot_slo))}
    rates = [float(r) for r in args.rates.split(",")]
    curves: dict[str, list[tuple[float, float | None, float | None]]] = {}
    print("| deployment | req/s per GPU | p90 TTFT ms | p90 TPOT ms | TTFT p50 split: queue / prefill / transfer (ms) "
          "| busy: prefill / decode pool |")
    print("|---|---|---|---|---|---|")
    for name, (d, gpus) in variants(data).items():
        for r in rates:
            s = run(d, r * gpus)
            ttft, tpot = s.get("p90_ttft_ms"), s.get("p90_tpot_ms")
            curves.setdefault(name, []).append((r, ttft, tpot))
            dis = s.get("disaggregation")
            split = pools = ""
            if dis:
                sp = dis["ttft_split"]
                split = " / ".join(f"{sp[k]['median_ms']:.1f}" for k in ("queue", "prefill", "transfer"))
                pools = f"{dis['pools']['prefill']['busy_fraction']:.0%} / {dis['pools']['decode']['busy_fraction']:.0%}"
            fmt = lambda v: "—" if v is None else f"{v:.1f}"  # noqa: E731
            print(f"| {name} | {r:g} | {fmt(ttft)} | {fmt(tpot)} | {split} | {pools} |")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, i, key, label in ((axes[0], 1, "ttft_ms", "p90 TTFT (ms)"), (axes[1], 2, "tpot_ms", "p90 TPOT (ms)")):
            for name, pts in curves.items():
                xs = [p[0] for p in pts]
                ys = [np.nan if p[i] is None else p[i] for p in pts]
                ax.plot(xs, ys, marker="o", label=name)
            for j, limit in enumerate(lines[key]):
                ax.axhline(limit, color="grey", ls=("--", ":", "-.")[j % 3], lw=1, label=f"SLO {limit:g} ms")
            ax.legend(fontsize=8)
            ax.set_xlabel("arrival rate per GPU (req/s)")
            ax.set_ylabel(label)
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
        fig.suptitle(f"{sc.name}: {sc.model} on {sc.hardware}, disaggregated vs colocated (one seed per point)")
        fig.tight_layout()
        Path(args.png).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.png, dpi=110)
        print(f"figure: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
