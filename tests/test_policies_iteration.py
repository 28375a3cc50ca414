"""Exact plans of the iteration-level policies: continuous and chunked prefill."""

from __future__ import annotations

import pytest

from batchsim.policies.chunked_prefill import ChunkedPrefillConfig, ChunkedPrefillPolicy
from batchsim.policies.continuous import ContinuousConfig, ContinuousPolicy
from batchsim.policies.ordering import fcfs, last_admitted, shortest_prompt_first
from tests.policy_fakes import FakeSeq, apply, decoding, make_view
from batchsim.sim.types import BatchPlan


def continuous(**kw) -> ContinuousPolicy:
    return ContinuousPolicy(ContinuousConfig(name="continuous", **kw))


def chunked(**kw) -> ChunkedPrefillPolicy:
    return ChunkedPrefillPolicy(ChunkedPrefillConfig(name="chunked_prefill", **kw))


def fresh(rid: int, prompt: int, max_tokens: int = 4, **kw) -> FakeSeq:
    return FakeSeq(rid, prompt, max_tokens, **kw)


# -- ordering -----------------------------------------------------------------
def test_orderings_keep_preempted_sequences_first():
    pre = FakeSeq(7, 9, 4, num_generated=2, num_preemptions=1)
    waiting = [pre, fresh(1, 6), fresh(2, 2), fresh(3, 6)]
    assert fcfs(waiting) == waiting
    assert [s.rid for s in shortest_prompt_first(waiting)] == [7, 2, 1, 3]
    assert last_admitted(waiting).rid == 3


# -- continuous, separate (vLLM v0) ---------------------------------------------
def test_separate_prefill_step_pauses_decodes_and_respects_seq_slots():
    view = make_view([fresh(10, 5), fresh(11, 5)], [decoding(0, 4, 8)])
    plan = continuous(max_num_seqs=2, max_num_batched_tokens=64).schedule(view)
    assert plan == BatchPlan(num_tokens={10: 5})


def test_separate_token_budget_stops_at_the_first_that_does_not_fit():
    view = make_view([fresh(0, 4), fresh(1, 5), fresh(2, 3), fresh(3, 1)])
    assert continuous(max_num_seqs=8, max_num_batched_tokens=10).schedule(view) == BatchPlan(
        num_tokens={0: 4, 1: 5})


def test_separate_kv_stops_at_the_first_whole_prompt_that_does_not_fit():
    # 3 blocks of 4: rid 0 takes 1 block, rid 1 (9 tokens) needs 3; rid 2 would fit but waits (FCFS).
    view = make_view([fresh(0, 4), fresh(1, 9), fresh(2, 1)], blocks=3, block_size=4)
    assert continuous().schedule(view) == BatchPlan(num_tokens={0: 4})


def test_separate_decodes_when_nobody_can_be_admitted():
    # 4 blocks of 4: the decodes hold 1 + 2 and rid 0 takes the last for its 5th token.
    view = make_view([fresh(5, 50)], [decoding(0, 4, 8), decoding(1, 6, 8)], blocks=4, block_size=4)
    assert continuous().schedule(view) == BatchPlan(num_tokens={0: 1, 1: 1})


def test_prompt_over_the_token_budget_is_rejected_naming_both_numbers():
    view = make_view([fresh(0, 3), fresh(1, 20), fresh(2, 4)])
    plan = continuous(max_num_seqs=4, max_num_batched_tokens=8).schedule(view)
    assert plan.num_tokens == {0: 3, 2: 4}
    assert plan.reject == {1: "needs 20 tokens in one step but max_num_batched_tokens is 8"}


# -- preemption (vLLM v0 _schedule_running) -------------------------------------
def test_decode_growth_preempts_the_most_recently_admitted():
    # Blocks of 2: each decode at 3 tokens needs a 2nd block; 4 blocks, 3 held, 1 free.
    running = [decoding(0, 2, 8, 1), decoding(1, 2, 8, 1), decoding(2, 2, 8, 1)]
    view = make_view([], running, blocks=4, block_size=2)
    assert view.kv.free_blocks == 1
    plan = continuous().schedule(view)
    assert plan == BatchPlan(num_tokens={0: 1, 1: 1}, preempt=(2,))
    apply(plan, view)  # the engine could grant it
    assert [s.rid for s in view.waiting] == [2] and view.waiting[0].num_computed == 0


def test_victim_is_the_sequence_itself_then_scheduling_stops():
    running = [decoding(0, 2, 8, 1), decoding(1, 2, 8, 1), decoding(2, 2, 8, 1)]
    view = make_view([fresh(9, 1)], running, blocks=3, block_size=2)
    plan = continuous(prefill_mode="mixed").schedule(view)
    # rid 0 grows by preempting rid 2; rid 1 can only preempt itself; nobody is admitted.
    assert plan == BatchPlan(num_tokens={0: 1}, preempt=(1, 2))
    apply(plan, view)
    assert [s.rid for s in view.waiting] == [1, 2, 9]


def test_a_victim_frees_every_block_it_holds():
    # rid 1 holds 3 blocks; preempting it lets rid 0 grow (1 block) and leaves 2 free.
    running = [decoding(0, 2, 8, 1), decoding(1, 6, 8, 1)]
    view = make_view([], running, blocks=4, block_size=2)
    assert view.kv.free_blocks == 0
    step = continuous().schedule(view)
    assert step == BatchPlan(num_tokens={0: 1}, preempt=(1,))


def test_preempted_sequence_regains_the_queue_front_under_fcfs():
    running = [decoding(0, 2, 3, 1), decoding(1, 2, 3, 1)]
    view = make_view([fresh(5, 2)], running, blocks=2, block_size=2)
    policy = continuous(max_num_seqs=4, max_num_batched_tokens=16)
    plans = []
    for _ in range(4):
        plans.append(policy.schedule(view))
        apply(plans[-1], view)
    assert plans[0] == BatchPlan(num_tokens={0: 1}, preempt=(1,))
    # rid 0 finishes after one more decode; then rid 1 (3 tokens recomputed) enters before rid 5.
    assert plans[1:] == [BatchPlan(num_tokens={0: 1}), BatchPlan(num_tokens={1: 3}),
                         BatchPlan(num_tokens={1: 1})]
    assert [s.rid for s in view.waiting] == [5]


# -- continuous, mixed (Orca) ------------------------------------------------------
def test_mixed_runs_decodes_then_whole_prompts_in_the_budget_left():
    view = make_view([fresh(10, 3), fresh(11, 4), fresh(12, 1)], [decoding(0, 4, 8), decoding(1, 6, 8)])
    plan = continuous(prefill_mode="mixed", max_num_seqs=8, max_num_batched_tokens=8).schedule(view)
    assert plan == BatchPlan(num_tokens={0: 1, 1: 1, 10: 3})


def test_mixed_fills_seq_slots_left_after_running():
    view = make_view([fresh(10, 3), fresh(11, 4)], [decoding(0, 4, 8), decoding(1, 6, 8)])
    plan = continuous(prefill_mode="mixed", max_num_seqs=3, max_num_batched_tokens=64).schedule(view)
    assert plan == BatchPlan(num_tokens={0: 1, 1: 1, 10: 3})


def test_shortest_prompt_first_order_keeps_preempted_first():
    pre = FakeSeq(7, 5, 4, num_generated=2, num_preemptions=1)  # recompute 7 tokens
    view = make_view([pre, fresh(1, 6), fresh(2, 2)])
    plan = continuous(order="shortest_prompt_first", max_num_seqs=8, max_num_batched_tokens=10).schedule(view)
    assert plan == BatchPlan(num_tokens={7: 7, 2: 2})


# -- chunked prefill (Sarathi-Serve / vLLM v1) --------------------------------------
def _chunk_view(budget_blocks: int = 100):
    partial = FakeSeq(5, 20, 4, num_computed=8)
    return make_view([fresh(9, 10)], [decoding(0, 4, 8), decoding(1, 6, 8), partial], blocks=budget_blocks,
                     block_size=4)


def test_chunked_budget_goes_to_decodes_then_the_partial_prefill_then_a_new_chunk():
    plan = chunked(max_num_seqs=8, max_num_batched_tokens=16).schedule(_chunk_view())
    assert plan == BatchPlan(num_tokens={0: 1, 1: 1, 5: 12, 9: 2})
    assert list(plan.num_tokens) == [0, 1, 5, 9]


def test_chunked_partial_prefill_takes_what_the_decodes_leave():
    plan = chunked(max_num_seqs=8, max_num_batched_tokens=8).schedule(_chunk_view())
    assert plan == BatchPlan(num_tokens={0: 1, 1: 1, 5: 6})


def test_chunked_stalled_partial_prefill_blocks_new_admissions():
    # Held: 1 + 2 + 2 blocks of 4; 7 total. rid 0's decode takes a block, leaving 1; rid 5's
    # chunk of 12 needs 3 more: it stalls and rid 9 (whose 2-token chunk would fit) is not admitted.
    view = _chunk_view(budget_blocks=7)
    assert view.kv.free_blocks == 2
    plan = chunked(max_num_seqs=8, max_num_batched_tokens=16).schedule(view)
    assert plan == BatchPlan(num_tokens={0: 1, 1: 1})


def test_chunked_decode_growth_preempts_the_partial_prefill_admitted_last():
    partial = FakeSeq(5, 20, 4, num_computed=8)  # holds 2 blocks of 4
    view = make_view([fresh(9, 3)], [decoding(0, 4, 8), partial], blocks=3, block_size=4)
    # rid 0 at 4 computed tokens needs a 2nd block for its 5th: none free, so rid 5 goes.
    plan = chunked(max_num_seqs=8, max_num_batched_tokens=16).schedule(view)
    assert plan == BatchPlan(num_tokens={0: 1}, preempt=(5,))


def test_chunked_long_prompt_is_split_never_rejected():
    plan = chunked(max_num_seqs=4, max_num_batched_tokens=16).schedule(make_view([fresh(0, 100), fresh(1, 3)]))
    assert plan == BatchPlan(num_tokens={0: 16})


def test_chunked_respects_max_num_seqs():
    view = make_view([fresh(9, 3)], [decoding(0, 4, 8), decoding(1, 6, 8)])
    assert chunked(max_num_seqs=2, max_num_batched_tokens=16).schedule(view) == BatchPlan(num_tokens={0: 1, 1: 1})


@pytest.mark.parametrize("make", [continuous, chunked])
def test_empty_replica_idles_until_the_next_arrival(make):
    assert make().schedule(make_view()) == BatchPlan()
