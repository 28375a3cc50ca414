"""Exact plans of the padded-batch policies: static and dynamic."""

from __future__ import annotations

import pytest

from batchsim.policies.dynamic import DynamicConfig, DynamicPolicy
from batchsim.policies.static import StaticConfig, StaticPolicy
from tests.policy_fakes import FakeKV, FakeSeq, apply, make_view, simulate
from batchsim.sim.types import BatchPlan


def static(**kw) -> StaticPolicy:
    return StaticPolicy(StaticConfig(name="static", **kw))


def dynamic(**kw) -> DynamicPolicy:
    return DynamicPolicy(DynamicConfig(name="dynamic", **kw))


def queue(*lengths: tuple[int, int], arrival: float = 0.0) -> list[FakeSeq]:
    """Waiting sequences with (prompt, max_tokens), rids 0.. in FCFS order."""
    return [FakeSeq(i, p, m, arrival=arrival) for i, (p, m) in enumerate(lengths)]


# -- launch ------------------------------------------------------------------
def test_launch_pads_to_longest_prompt_and_reserves_padded_kv():
    view = make_view(queue((4, 2), (10, 5), (7, 1), (3, 1)), block_size=4)
    plan = static(max_batch_size=3).schedule(view)
    assert plan == BatchPlan(
        num_tokens={0: 4, 1: 10, 2: 7},
        reserve={0: 15, 1: 15, 2: 15},
        padding=((6, 4, False), (3, 7, False)),
        hold_finished=True,
        complete_on_release=True,  # (complete_at: batch_end, the default: held until the batch returns)
    )


def test_launch_shrinks_to_the_fcfs_prefix_whose_reservation_fits():
    # 8 blocks of 4 tokens: two members reserve 15 tokens = 4 blocks each; a third does not fit.
    view = make_view(queue((4, 2), (10, 5), (7, 1)), blocks=8, block_size=4)
    plan = static(max_batch_size=3).schedule(view)
    assert plan.num_tokens == {0: 4, 1: 10}
    assert plan.reserve == {0: 15, 1: 15}
    assert plan.padding == ((6, 4, False),)


def test_static_waits_for_a_full_batch_until_the_timeout():
    policy = static(max_batch_size=3, timeout_s=0.5)
    waiting = [FakeSeq(0, 4, 1, arrival=0.1), FakeSeq(1, 4, 1, arrival=0.3)]
    assert policy.schedule(make_view(waiting, now=0.4)) == BatchPlan(idle_until=0.6)
    assert policy.schedule(make_view(waiting, now=0.6)).num_tokens == {0: 4, 1: 4}
    full = waiting + [FakeSeq(2, 4, 1, arrival=0.35)]
    assert policy.schedule(make_view(full, now=0.4)).num_tokens == {0: 4, 1: 4, 2: 4}


def test_static_without_timeout_launches_whoever_waits_up_to_b():
    policy = static(max_batch_size=2)
    assert policy.schedule(make_view(queue((3, 1)))).num_tokens == {0: 3}
    assert policy.schedule(make_view(queue((3, 1), (2, 1), (5, 1)))).num_tokens == {0: 3, 1: 2}
    assert policy.schedule(make_view()) == BatchPlan()


# -- a whole batch: dead slots and release -------------------------------------
def _run_batch(complete_at: str) -> tuple[list[BatchPlan], list[FakeSeq]]:
    seqs = queue((2, 1), (4, 3))
    view = make_view(seqs, block_size=1)
    policy = static(max_batch_size=2, complete_at=complete_at)
    plans = []
    for _ in range(4):
        plans.append(policy.schedule(view))
        apply(plans[-1], view)
    assert not view.running and not view.kv.held
    return plans, seqs


def test_batch_decodes_in_lockstep_billing_dead_slots_then_releases_all():
    plans, seqs = _run_batch("batch_end")
    assert plans == [
        BatchPlan(num_tokens={0: 2, 1: 4}, reserve={0: 7, 1: 7}, padding=((2, 2, False),), hold_finished=True,
                  complete_on_release=True),
        BatchPlan(num_tokens={1: 1}, padding=((1, 4, True),), hold_finished=True,
                  complete_on_release=True),
        BatchPlan(num_tokens={1: 1}, padding=((1, 5, True),), hold_finished=True,
                  complete_on_release=True),
        BatchPlan(release=(0, 1), complete_on_release=True),
    ]
    assert [s.completion for s in seqs] == [3.0, 3.0]


def test_live_rows_are_billed_over_the_padded_context():
    # rid 0 has the shorter prompt (2 vs 4) and the longer output: after rid 1
    # finishes, rid 0's row still attends over the padded length 4 + t.
    seqs = queue((2, 3), (4, 1))
    view = make_view(seqs, block_size=1)
    policy = static(max_batch_size=2)
    plans = []
    for _ in range(4):
        plans.append(policy.schedule(view))
        apply(plans[-1], view)
    assert plans[1] == BatchPlan(num_tokens={0: 1}, context={0: 4}, padding=((1, 4, True),), hold_finished=True,
                  complete_on_release=True)
    assert plans[2] == BatchPlan(num_tokens={0: 1}, context={0: 5}, padding=((1, 5, True),), hold_finished=True,
                  complete_on_release=True)


def test_own_token_completion_keeps_each_members_finish_time():
    plans, seqs = _run_batch("own_token")
    assert plans[-1] == BatchPlan(release=(0, 1), complete_on_release=False)
    assert [s.completion for s in seqs] == [1.0, 3.0]


def test_release_frees_the_reservation_for_the_next_batch_in_the_same_plan():
    # One block of 4 tokens: the next batch fits only once the first is released.
    seqs = queue((2, 1), (3, 1))
    view = make_view(seqs, blocks=1, block_size=4)
    policy = static(max_batch_size=1)
    first = policy.schedule(view)
    assert first.num_tokens == {0: 2} and first.reserve == {0: 3}
    apply(first, view)
    assert view.kv.free_blocks == 0
    assert policy.schedule(view) == BatchPlan(
        num_tokens={1: 3}, reserve={1: 4}, hold_finished=True, release=(0,), complete_on_release=True)


def test_release_with_a_pending_timeout_sleeps_until_it():
    view = make_view([FakeSeq(1, 3, 1, arrival=0.5)], [FakeSeq(0, 2, 1, num_computed=2, num_generated=1,
                                                                finished=True)], now=1.0)
    plan = static(max_batch_size=4, timeout_s=2.0).schedule(view)
    assert plan == BatchPlan(release=(0,), complete_on_release=True, idle_until=2.5)


# -- dynamic ---------------------------------------------------------------------
@pytest.mark.parametrize("n, launched", [(9, 8), (8, 8), (5, 4), (3, 2), (2, 2)])
def test_dynamic_launches_max_or_the_largest_preferred_size(n, launched):
    policy = dynamic(max_batch_size=8, preferred_batch_sizes=[4, 2], max_queue_delay_s=1.0)
    plan = policy.schedule(make_view(queue(*[(3, 1)] * n)))
    assert list(plan.num_tokens) == list(range(launched))


def test_dynamic_waits_for_the_queue_delay_then_launches_all():
    policy = dynamic(max_batch_size=8, preferred_batch_sizes=[4], max_queue_delay_s=0.25)
    waiting = queue((3, 1), (5, 1), (2, 1), arrival=0.5)
    assert policy.schedule(make_view(waiting, now=0.6)) == BatchPlan(idle_until=0.75)
    assert policy.schedule(make_view(waiting, now=0.75)).num_tokens == {0: 3, 1: 5, 2: 2}


def test_dynamic_late_arrivals_join_the_pending_batch():
    seqs = [FakeSeq(0, 3, 1, arrival=0.0), FakeSeq(1, 3, 1, arrival=0.005), FakeSeq(2, 3, 1, arrival=0.5)]
    run = simulate(dynamic(max_queue_delay_s=0.01), seqs, FakeKV(16, 100))
    assert [p.idle_until for p in run.plans[:2]] == [0.01, 0.01]
    assert run.plans[2].num_tokens == {0: 3, 1: 3}
    assert sorted(run.finished) == [0, 1, 2] and not run.stuck


def test_dynamic_shares_the_padded_batch_execution_with_static():
    a, b = static(max_batch_size=2), dynamic(max_batch_size=2)
    for seqs in (queue((2, 2), (5, 3)), queue((7, 1), (1, 4))):
        va, vb = make_view(seqs), make_view([FakeSeq(s.rid, s.prompt_tokens, s.max_tokens) for s in seqs])
        for _ in range(5):
            pa, pb = a.schedule(va), b.schedule(vb)
            assert pa == pb
            apply(pa, va)
            apply(pb, vb)
