"""What a long run sustains, to hold a plan's capacity against (docs/capacity-planning.md).

Runs a scenario at each rate with many requests (default 20,000: hundreds of p99 E2E times at the
rates that matter for examples/plan-chat.yaml) on a few seeds, and prints each run's SLO metrics and
whether it meets the SLOs. A plan's capacity should sit at or below the highest rate that meets
them on every seed.

    python scripts/steady_check.py [--scenario batchsim/examples/plan-chat.yaml]
        [--rates 15,15.5,16,16.5,17] [--requests 20000] [--seeds 3]
        [--slo p99_ttft_ms=1500 --slo p99_tpot_ms=60] [--set tensor_parallel_size=2 ...]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _one(args: tuple[str, float, int, int, tuple[str, ...], tuple[str, ...]]) -> dict:
    from batchsim.app.config import load_scenario
    from batchsim.app.runner import run_scenario

    path, rate, seed, requests, keys, extra = args
    sets = [*extra, f"seed={seed}", f"workload.num_requests={requests}", f"workload.arrival.rate={rate}"]
    s = run_scenario(load_scenario(path, sets), keep_steps=False).summary
    return {"rate": rate, "seed": seed, "span": s["duration_s"], **{k: s.get(k) for k in keys},
            "p99_e2el_ms": s.get("p99_e2el_ms")}


def main() -> None:
    from batchsim.app.capacity.search import parse_slos

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(ROOT / "batchsim" / "examples" / "plan-chat.yaml"))
    ap.add_argument("--rates", default="15,15.5,16,16.5,17")
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--slo", action="append", default=None)
    ap.add_argument("--set", action="append", default=[], help="a scenario override, as batchsim run --set")
    args = ap.parse_args()
    slos = parse_slos(args.slo or ["p99_ttft_ms=1500", "p99_tpot_ms=60"])
    rates = [float(r) for r in args.rates.split(",")]
    jobs = [(args.scenario, r, s, args.requests, tuple(slos), tuple(args.set)) for r in rates for s in range(args.seeds)]
    print(f"{args.scenario} {' '.join(args.set)}: {args.requests} requests per run, seeds 0..{args.seeds - 1}; SLOs "
          + ", ".join(f"{k} <= {v:g}" for k, v in slos.items()))
    with ProcessPoolExecutor(2) as ex:
        for row in ex.map(_one, jobs):
            ok = all(row[k] is not None and row[k] <= v for k, v in slos.items())
            metrics = "  ".join(f"{k} {row[k]:8.1f}" for k in slos)
            print(f"{row['rate']:7.2f} req/s seed {row['seed']}: {metrics}  (run {row['span']:.0f} s, "
                  f"p99 E2E {row['p99_e2el_ms'] / 1000:.0f} s)  {'meets' if ok else 'FAILS'}", flush=True)


if __name__ == "__main__":
    main()
