"""Test doubles for engine tests: a constant-time cost model and a runner."""

from __future__ import annotations

import numpy as np
import simpy

from sim.engine import Cluster, Replica
from sim.kv import PagedKVCache
from sim.metrics import RunTotals, summarize
from sim.records import ItlLog, StepLog, request_frame
from sim.router import make_router
from sim.types import StepCost, StepShape, Workload


class ConstantCost:
    """Every step takes ``seconds``; FLOPs = tokens, bytes = rows."""

    peak_flops = 1e12
    peak_bandwidth = 1e12

    def __init__(self, seconds: float = 1.0, per_token: float = 0.0) -> None:
        self.seconds, self.per_token = seconds, per_token

    def price(self, shape: StepShape, breakdown: bool = False) -> StepCost:
        t = self.seconds + self.per_token * float(shape.q.sum())
        return StepCost(seconds=t, flops=float(shape.q.sum()), bytes=float(shape.num_rows),
                        memory_s=t)


def workload(arrivals, prompts, outputs) -> Workload:
    return Workload(arrival=np.asarray(arrivals, dtype=float),
                    prompt_tokens=np.asarray(prompts, dtype=np.int64),
                    output_tokens=np.asarray(outputs, dtype=np.int64))


def run_engine(policy_factory, wl: Workload, cost=None, replicas: int = 1, kv_blocks: int = 1000,
               block_size: int = 16, max_model_len: int = 100_000, router: str = "round_robin",
               horizon: float | None = None, seed: int = 0, kv_factory=None,
               fast_forward: bool = False):
    """Run the engine directly; returns (requests df, steps df, itl df, cluster)."""
    env = simpy.Environment()
    steps, itl = StepLog(), ItlLog()
    cost = cost or ConstantCost()
    kv_factory = kv_factory or (lambda: PagedKVCache(kv_blocks, block_size))
    reps = [Replica(env, i, policy_factory(), cost, kv_factory(),
                    max_model_len, steps, itl) for i in range(replicas)]
    cluster = Cluster(env, reps, make_router(router, np.random.default_rng(seed)), wl)
    if fast_forward:
        for r in reps:
            r.enable_fast_forward(lambda: cluster.next_arrival, horizon, cluster.arrival_times)
    env.run(until=horizon)
    cluster.sync()
    return request_frame(cluster.requests), steps.frame(), itl.frame(), cluster


def summary_of(req, steps, itl, cluster, policy="test"):
    kv = cluster.replicas[0].kv
    end = float(steps["end"].max()) if len(steps) else 0.0
    totals = RunTotals(replicas=len(cluster.replicas), sim_end=end, peak_flops=1e12,
                       peak_bandwidth=1e12, kv_total_blocks=kv.total_blocks,
                       kv_peak_blocks=max(r.kv.peak_used for r in cluster.replicas))
    return summarize(req, steps, itl, totals, policy)
