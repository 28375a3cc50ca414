"""How often the plan's seed-sized 95% interval covers the true mean (docs/capacity-planning.md).

A point starts with DEFAULT_SEEDS seeds and adds one at a time until the metric's 95%
half-width is within DEFAULT_CI_WIDTH of its mean, or DEFAULT_MAX_SEEDS is reached
(batchsim.app.capacity.worker). That stopping rule depends on the data, so the nominal
95% is not exact; this Monte Carlo draws a normal metric (mean 1, coefficient of
variation CV across seeds) and counts coverage.

    python scripts/interval_coverage.py [--trials 20000]
"""

from __future__ import annotations

import argparse

import numpy as np

from batchsim.app.capacity.worker import DEFAULT_CI_WIDTH, DEFAULT_MAX_SEEDS, DEFAULT_SEEDS
from batchsim.reports.stats import mean_ci


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"start {DEFAULT_SEEDS} seeds, add until half-width <= {DEFAULT_CI_WIDTH:.0%} of the mean, "
          f"at most {DEFAULT_MAX_SEEDS}")
    for cv in (0.05, 0.10, 0.15, 0.25):
        cover = seeds = 0
        for _ in range(args.trials):
            xs = list(rng.normal(1.0, cv, DEFAULT_SEEDS))
            while True:
                m, h = mean_ci(xs)
                if len(xs) >= DEFAULT_MAX_SEEDS or h / m <= DEFAULT_CI_WIDTH:
                    break
                xs.append(rng.normal(1.0, cv))
            cover += abs(m - 1.0) <= h
            seeds += len(xs)
        print(f"CV {cv:.2f}: coverage {cover / args.trials:.3f}, mean seeds {seeds / args.trials:.1f}")


if __name__ == "__main__":
    main()
