"""Padded batches run through completions (sim.runs, ``steady_dead_slots``): a static or
dynamic batch's finished members are billed as dead slots exactly like live rows, so
one fast-forwarded run goes from the batch's first decode to its last completion.
Records must equal step-by-step ones byte for byte."""

from __future__ import annotations

import numpy as np

import policies
from policies.padded import PaddedBatchPolicy
from sim.engine import Replica
from tests.engine_helpers import run_engine, workload
from tests.test_cohort import _per_replica_order
from tests.test_fast_forward import _TINY_COST


def test_padded_runs_through_completions_are_exact(monkeypatch):
    """Batches of members with very different output lengths, on 1-3 replicas, with
    both completion rules, horizons and queue limits; the test checks that runs did
    go through several completions each, and that records, KV and busy time equal the
    step-by-step engine's."""
    seen = {"runs": 0, "inside": 0, "several": 0, "mid_arrivals": 0}
    real = Replica._apply_dead_rows

    def counted(self, plan, rows, dead, alive, ends, m):
        seen["runs"] += 1
        inside = int((dead < m).sum())  # members that finished in the bulk steps
        seen["inside"] += inside
        seen["several"] += inside > 1
        return real(self, plan, rows, dead, alive, ends, m)

    monkeypatch.setattr(Replica, "_apply_dead_rows", counted)
    rng = np.random.default_rng(7)
    for case in range(120):
        n = int(rng.integers(4, 30))
        arrivals = np.sort(rng.uniform(0, float(rng.choice([0.5, 4.0, 20.0])), n))
        wl = workload(arrivals, rng.integers(1, 300, n), rng.integers(1, 200, n))
        complete_at = ["batch_end", "own_token"][case % 2]
        spec = ({"name": "static", "max_batch_size": int(rng.integers(2, 9)), "timeout_s": 0.3,
                 "complete_at": complete_at} if case % 3 else
                {"name": "dynamic", "max_batch_size": int(rng.integers(2, 9)), "max_queue_delay_s": 0.05,
                 "complete_at": complete_at})
        replicas, router = [(1, "round_robin"), (2, "least_outstanding"), (3, "least_kv"),
                            (1, "round_robin"), (2, "round_robin")][case % 5]
        horizon = [None, None, None, 2.0][case % 4]
        bs = int(rng.choice([4, 16]))
        outs = []
        for ff in (True, False):
            req, steps, itl, cluster = run_engine(lambda: policies.create_policy(spec), wl, cost=_TINY_COST,
                                                  kv_blocks=4000 // bs, block_size=bs, fast_forward=ff,
                                                  replicas=replicas, router=router, horizon=horizon)
            outs.append((_per_replica_order(req, steps, itl),
                         [(r.kv.used_blocks, r.kv.peak_used, r.busy_s) for r in cluster.replicas]))
            if ff:
                seen["mid_arrivals"] += int((steps["waiting"].diff() > 0).sum())
        assert outs[0] == outs[1], (case, spec, replicas, router, horizon, bs)
    assert seen["runs"] > 100 and seen["inside"] > 300 and seen["several"] > 50, seen


def test_without_the_promise_runs_stop_at_each_completion(monkeypatch):
    """The promise is what lets a run go on: without it, the same batch takes a run per
    completion (and the records are still the same)."""
    wl = workload([0.0] * 8, [50] * 8, [10, 20, 30, 40, 50, 60, 70, 80])
    spec = {"name": "static", "max_batch_size": 8, "complete_at": "own_token"}
    counts, outs = [], []
    for promise in (True, False):
        monkeypatch.setattr(PaddedBatchPolicy, "steady_dead_slots", promise)
        rounds = [0]
        real = policies.create_policy(spec).__class__.schedule

        def schedule(self, view, _real=real):
            rounds[0] += 1
            return _real(self, view)

        monkeypatch.setattr(policies.create_policy(spec).__class__, "schedule", schedule)
        req, steps, itl, cluster = run_engine(lambda: policies.create_policy(spec), wl, cost=_TINY_COST,
                                              fast_forward=True)
        monkeypatch.undo()
        counts.append(rounds[0])
        outs.append((req.to_csv(), steps.to_csv(), itl.to_csv()))
    assert outs[0] == outs[1]
    # eight members finishing at eight different steps: one run instead of one per completion
    assert counts[1] - counts[0] >= 7, counts
