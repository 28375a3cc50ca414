"""sha256 of the outputs of fixed scenarios: the check that a change is exact.

Runs every built-in policy (continuous separate and mixed, chunked_prefill,
static, dynamic) at the benchmark's two loads (bench/scenarios.py) on 1 and 3
replicas (``least_outstanding``) and on 2 (``least_kv``), with full records,
plus the same cases with aggregate records, and prints one line per scenario:
``<sha256 of summary.json + requests.csv + steps.csv>  <name>``. Run it
before and after a change and ``diff`` the two listings::

    python scripts/output_hashes.py --requests 2000 > before.txt
    ... change ...
    python scripts/output_hashes.py --requests 2000 > after.txt && diff before.txt after.txt

``--engine python`` (or ``core``) pins the engine; the default is the
scenario default (``auto``). The summary's ``engine`` block is left out of
the hash (it says which engine ran, which is the point of comparing them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scenarios import LOADS, BenchCase  # noqa: E402

_POLICIES = [("continuous", {}), ("continuous_mixed", {"prefill_mode": "mixed"}), ("chunked_prefill", {}),
             ("static", {}), ("dynamic", {"preferred_batch_sizes": [4, 8]})]
_LAYOUTS = [(1, "least_outstanding"), (3, "least_outstanding"), (2, "least_kv")]


def scenarios(requests: int) -> list[tuple[str, dict]]:
    """The fixed scenarios, by name."""
    out = []
    for label, knobs in _POLICIES:
        policy = label.split("_mixed")[0]
        for load in LOADS:
            for replicas, router in _LAYOUTS:
                for records in ("full", "aggregate"):
                    if records == "aggregate" and replicas == 3:
                        continue
                    sc = BenchCase(requests, policy, load, replicas).scenario()
                    sc["policy"] = {"name": policy, **knobs}
                    sc["router"] = router
                    sc["measure"] = {"step_records": True, "records": records}
                    sc["name"] = f"{label}/{load}/r{replicas}-{router}/{records}"
                    out.append((sc["name"], sc))
    return out


def digest(out: Path) -> str:
    h = hashlib.sha256()
    summary = json.loads((out / "summary.json").read_text())
    # (engine keys say which engine ran; warnings and rejected_by_reason were added in the ninth session)
    for k in ("engine", "engine_reason", "provenance", "warnings", "rejected_by_reason"):
        summary.pop(k, None)
    h.update(json.dumps(summary, sort_keys=True).encode())
    for name in ("requests.csv", "steps.csv"):
        p = out / name
        h.update(p.read_bytes() if p.exists() else b"-")
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--engine", choices=["auto", "python", "core"], default=None)
    ap.add_argument("--only", default="", help="substring of the scenario names to run")
    args = ap.parse_args(argv)
    from batchsim.app.config import scenario_from_dict
    from batchsim.app.runner import run_scenario, write_outputs

    for name, sc in scenarios(args.requests):
        if args.only not in name:
            continue
        if args.engine:
            sc["engine"] = args.engine
        result = run_scenario(scenario_from_dict(sc))
        with tempfile.TemporaryDirectory() as d:
            write_outputs(result, d)
            print(f"{digest(Path(d))}  {name}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
