"""Engine tests: exact timelines with a constant-time cost model."""

from __future__ import annotations

import math

import pytest

from batchsim.sim.engine import PolicyError
from batchsim.sim.types import BatchPlan
from tests.engine_helpers import ConstantCost, run_engine, summary_of, workload


class MixedAll:
    """A minimal Orca-style policy double: every running decode plus every
    waiting prompt whole, each step (no limits)."""

    name = "mixed-all"

    def schedule(self, view):
        plan = {s.rid: s.pending for s in view.running}
        for s in view.waiting:
            plan[s.rid] = s.pending
        return BatchPlan(num_tokens=plan)


def test_three_requests_hand_worked_timeline():
    # A at 0, B at 0.5, C at 2.5; prompts of 4 tokens, 3 output tokens, 1 s steps.
    # t=0-1: A prefill (A tok1 @1). 1-2: A dec + B prefill (A tok2, B tok1 @2).
    # 2-3: A, B dec (A tok3 -> done @3; B tok2). 3-4: B dec + C prefill (B done @4; C tok1).
    # 4-5, 5-6: C decodes (C done @6).
    req, steps, itl, cl = run_engine(MixedAll, workload([0, 0.5, 2.5], [4, 4, 4], [3, 3, 3]))
    assert req["first_token"].tolist() == [1.0, 2.0, 4.0]
    assert req["completion"].tolist() == [3.0, 4.0, 6.0]
    assert req["ttft"].tolist() == [1.0, 1.5, 1.5]
    assert req["e2el"].tolist() == [3.0, 3.5, 3.5]
    assert req["tpot"].tolist() == [1.0, 1.0, 1.0]
    assert steps["start"].tolist() == [0, 1, 2, 3, 4, 5]
    assert steps["num_seqs"].tolist() == [1, 2, 2, 2, 1, 1]
    assert steps["prefill_tokens"].tolist() == [4, 4, 0, 4, 0, 0]
    assert steps["decode_tokens"].tolist() == [0, 1, 2, 1, 1, 1]
    assert sorted(itl["gap"].tolist()) == [1.0] * 6
    s = summary_of(req, steps, itl, cl)
    assert s["completed"] == 3 and s["rejected"] == 0 and s["unfinished"] == 0
    assert s["median_ttft_ms"] == 1500.0
    assert s["duration_s"] == 6.0
    assert s["output_throughput"] == 9 / 6.0
    assert s["busy_fraction"] == 1.0


def test_idle_replica_wakes_on_arrival():
    req, steps, _, _ = run_engine(MixedAll, workload([0, 10], [2, 2], [1, 1]))
    assert req["first_token"].tolist() == [1.0, 11.0]
    assert req["completion"].tolist() == [1.0, 11.0]
    assert math.isnan(req["tpot"][0])  # one output token: TPOT undefined


def test_kv_freed_on_completion_and_peak_tracked():
    req, steps, _, cl = run_engine(MixedAll, workload([0], [16], [2]), block_size=16)
    kv = cl.replicas[0].kv
    assert kv.used_blocks == 0
    assert kv.peak_used == 2  # 16 prompt tokens + 1 decode token -> 2 blocks
    assert steps["kv_used_blocks"].tolist() == [1, 0]


def test_reject_too_long_and_horizon_unfinished():
    req, _, _, _ = run_engine(MixedAll, workload([0, 0], [50, 5], [60, 5]), max_model_len=100)
    assert req["status"].tolist() == ["rejected", "completed"]
    assert "max_model_len 100" in req["reason"][0]
    req, _, _, _ = run_engine(MixedAll, workload([0, 0], [5, 5], [100, 2]), horizon=3.5)
    assert req["status"].tolist() == ["unfinished", "completed"]


class HoldThenRelease:
    """Static-like double: hold finished sequences until every member is done."""

    name = "hold"

    def __init__(self):
        self.members = None

    def schedule(self, view):
        if self.members and all(s.finished for s in view.running):
            done, self.members = tuple(s.rid for s in view.running), None
            return BatchPlan(release=done, complete_on_release=True)
        if self.members is None and view.waiting:
            self.members = [s.rid for s in view.waiting]
            return BatchPlan(num_tokens={s.rid: s.pending for s in view.waiting}, hold_finished=True)
        live = {s.rid: 1 for s in view.running if not s.finished}
        dead = tuple((1, s.num_computed, True) for s in view.running if s.finished)
        return BatchPlan(num_tokens=live, padding=dead, hold_finished=True)


def test_hold_and_release_completes_at_batch_end_and_bills_dead_slots():
    req, steps, _, cl = run_engine(HoldThenRelease, workload([0, 0], [4, 4], [1, 3]))
    assert req["last_token"].tolist() == [1.0, 3.0]
    assert req["completion"].tolist() == [3.0, 3.0]
    assert steps["num_rows"].tolist() == [2, 2, 2]
    assert steps["num_seqs"].tolist() == [2, 1, 1]
    assert steps["padding_tokens"].tolist() == [0, 1, 1]
    assert cl.replicas[0].kv.used_blocks == 0


def test_preemption_recomputes_and_keeps_generated_tokens():
    class PreemptOnce:
        name = "preempt-once"

        def __init__(self):
            self.done = False

        def schedule(self, view):
            if not self.done and view.running and view.running[0].num_generated == 2:
                self.done = True
                return BatchPlan(preempt=(view.running[0].rid,))
            seqs = list(view.running) + list(view.waiting)
            return BatchPlan(num_tokens={s.rid: s.pending for s in seqs})

    req, steps, itl, _ = run_engine(PreemptOnce, workload([0], [4], [4]))
    # tok1 @1, tok2 @2, preempted at 2 then recompute 4+2 tokens -> tok3 @3, tok4 @4
    assert steps["prefill_tokens"].tolist() == [4, 0, 6, 0]
    assert req["preemptions"].tolist() == [1]
    assert req["completion"].tolist() == [4.0]


def test_bad_plan_raises_policy_error():
    class Greedy:
        name = "greedy"

        def schedule(self, view):
            return BatchPlan(num_tokens={s.rid: s.pending + 1 for s in view.waiting})

    with pytest.raises(PolicyError):
        run_engine(Greedy, workload([0], [4], [2]))


def test_cluster_round_robin_spreads_requests():
    req, _, _, _ = run_engine(MixedAll, workload([0, 0, 0, 0], [4] * 4, [2] * 4), replicas=2)
    assert req["replica"].tolist() == [0, 1, 0, 1]
    assert (req["completion"] == 2.0).all()


def test_constant_cost_prices_tokens():
    c = ConstantCost(1.0, per_token=0.5)
    req, steps, _, _ = run_engine(lambda: MixedAll(), workload([0], [4], [2]), cost=c)
    assert steps["end"].tolist() == [3.0, 4.5]


def test_a_policy_reading_running_sees_current_counters():
    """A policy that reads ``view.running`` sees every sequence's counters as of now."""
    from batchsim.policies.continuous import ContinuousPolicy

    seen = []

    class Peeking(ContinuousPolicy):
        def schedule(self, view):
            plan = super().schedule(view)
            for s in view.running:
                seen.append((s.num_computed, s.num_tokens, s.num_generated))
                assert s.num_tokens - s.num_computed >= 1
            return plan

    wl = workload([0.0, 0.0, 0.01], [30, 50, 20], [40, 12, 25])
    run_engine(lambda: Peeking(Peeking.Config(name="continuous")), wl, cost=ConstantCost(0.01), kv_blocks=64,
               block_size=8)
    assert max(g for _, _, g in seen) >= 39  # counters advanced step by step
