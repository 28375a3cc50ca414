"""Per-policy step-time errors of a recorded validation, with the slow host stretches set apart.

    python scripts/step_errors.py docs/validation-h200/validate-llama-3-8b \\
        [--recorded docs/validation-h200/profile-device.yaml --profile batchsim/calibrate/profiles/h200-bf16.yaml]

Reads each policy's executor_step_times.csv (measured and predicted seconds,
the host's enqueue time) and executor_steps.csv (which steps had decode rows),
and prints the share of steps whose enqueue took over ``--slow-ms`` (the
host-bound stretches of docs/validation.md section 5) and the median
predicted/measured - 1 over the others. With ``--recorded`` (the profile the
run was priced with) and ``--profile`` (another one that differs from it only
in host overhead, as a refit of the host term does), the predictions are
re-priced with the other profile's host terms first; profiles whose other
figures differ by over 1% are refused, since only the host terms can be
re-priced from these records.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from batchsim.calibrate.hardware import load_hardware  # noqa: E402

POLICIES = ("static", "dynamic", "continuous", "chunked_prefill")


def host_seconds(profile, rows: np.ndarray, decode: np.ndarray) -> np.ndarray:
    h = profile.host_overhead
    return (h.per_step_us + h.per_seq_us * rows + h.per_decode_step_us * decode) * 1e-6


def _numbers(value) -> list[float]:
    """Every number in a nested dump, in order."""
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in _numbers(value[k])]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--recorded", type=Path, help="the profile the run's predictions were priced with")
    ap.add_argument("--profile", type=Path, help="re-price the host term with this profile")
    ap.add_argument("--slow-ms", type=float, default=30.0, help="enqueue time past which a step is 'slow'")
    args = ap.parse_args()
    old = new = None
    if (args.recorded is None) != (args.profile is None):
        sys.exit("error: --recorded and --profile go together")
    if args.profile is not None:
        old, new = load_hardware(str(args.recorded)), load_hardware(str(args.profile))
        a, b = (_numbers(p.model_dump(exclude={"name", "description", "host_overhead", "provenance"}))
                for p in (old, new))
        worst = max((abs(x / y - 1.0) if y else abs(x) for x, y in zip(a, b)), default=0.0)
        if len(a) != len(b) or worst > 0.01:
            sys.exit("error: the profiles differ in more than host overhead (kernel curves, peaks or launch "
                     f"{worst:.1%} apart); only the host terms can be re-priced here")
        print(f"(re-priced host terms; the profiles' other figures agree within {worst:.2%})")
    print(f"{'policy':16s} {'steps':>6s} {'slow':>6s} {'median error (others)':>22s}")
    for p in POLICIES:
        times, steps = args.folder / p / "executor_step_times.csv", args.folder / p / "executor_steps.csv"
        if not times.is_file():
            continue
        t = pd.read_csv(times)
        pred = t["predicted_s"].to_numpy()
        if old is not None:
            st = pd.read_csv(steps)
            if len(st) != len(t):
                sys.exit(f"error: {steps} has {len(st)} steps, {times} {len(t)}")
            rows, dec = t["rows"].to_numpy(), (st["decode_tokens"] > 0).to_numpy()
            pred = pred - host_seconds(old, rows, dec) + host_seconds(new, rows, dec)
        fast = t["enqueue_s"].to_numpy() * 1e3 <= args.slow_ms
        err = pred[fast] / t["measured_s"].to_numpy()[fast] - 1.0
        print(f"{p:16s} {len(t):6d} {1 - fast.mean():6.1%} {np.median(err):+22.1%}")


if __name__ == "__main__":
    main()
