"""The recipe's admission rules (batchsim/policies/recipe.py ``admission``), worked by hand.

``step`` admits on this step's tokens and preempts later; ``sequence`` (vLLM v1
``scheduler_reserve_full_isl``) admits only when the whole known sequence fits;
``completion`` (TensorRT-LLM ``GUARANTEED_NO_EVICT``) reserves prompt + max_tokens at
admission and never preempts. Both engines run the same rule (tests/test_core.py runs
each rule on both).
"""

from __future__ import annotations

import numpy as np
import pytest

from batchsim import policies
from batchsim.sim.types import Workload
from tests.engine_helpers import ConstantCost, run_engine


def _wl(n: int, prompt: int, output: int, gap: float = 0.0) -> Workload:
    return Workload(arrival=np.arange(n) * gap, prompt_tokens=np.full(n, prompt, np.int64),
                    output_tokens=np.full(n, output, np.int64))


def _run(admission: str, wl: Workload, blocks: int, name: str = "continuous", **kw):
    spec = {"name": name, "max_num_seqs": 8, "max_num_batched_tokens": 64, "admission": admission, **kw}
    return run_engine(lambda: policies.create_policy(spec), wl, cost=ConstantCost(0.01), kv_blocks=blocks,
                      block_size=4)


def test_completion_reserves_prompt_plus_output_and_never_preempts():
    # 4 requests of 8 prompt + 8 output tokens: 16 tokens = 4 blocks each to completion; 10 blocks hold two.
    req, steps, _, cluster = _run("completion", _wl(4, 8, 8), blocks=10)
    assert (req["status"] == "completed").all()
    assert req["preemptions"].sum() == 0
    # the first step admits exactly two (2 x 4 blocks reserved; a third needs 4 of the 2 left)
    assert int(steps["num_seqs"].iloc[0]) == 2
    assert int(steps["kv_used_blocks"].iloc[0]) == 8
    # the other two wait until both finish: their first tokens come after the first two complete
    done = req.sort_values("rid")
    assert done["first_token"].iloc[2] > done["completion"].iloc[:2].max() - 1e-12


def test_step_admission_preempts_where_completion_waits():
    wl = _wl(4, 8, 8)
    step_req, *_ = _run("step", wl, blocks=10)
    assert step_req["preemptions"].sum() > 0  # all four admitted on their prompts, then KV ran out
    comp_req, *_ = _run("completion", wl, blocks=10)
    assert comp_req["preemptions"].sum() == 0


def test_sequence_admission_checks_the_whole_prompt_but_allocates_the_chunk():
    # A (8 prompt + 12 output) holds 2-5 of 12 blocks while it runs; B's 44-token prompt needs 11 blocks.
    # 'step' starts B's chunks beside A; 'sequence' waits until A has finished and freed its blocks.
    wl = Workload(arrival=np.array([0.0, 0.0]), prompt_tokens=np.array([8, 44], np.int64),
                  output_tokens=np.array([12, 2], np.int64))
    first = {}
    for rule in ("step", "sequence"):
        req, steps, _, _ = run_engine(
            lambda: policies.create_policy({"name": "chunked_prefill", "max_num_seqs": 4,
                                            "max_num_batched_tokens": 8, "admission": rule}),
            wl, cost=ConstantCost(0.01), kv_blocks=12, block_size=4)
        assert (req["status"] == "completed").all(), rule
        first[rule] = (float(req["admitted"].iloc[1]), float(req["completion"].iloc[0]), steps)
    admitted, a_done, _ = first["step"]
    assert admitted < a_done
    admitted, a_done, steps = first["sequence"]
    assert admitted >= a_done
    # and B's admission step allocates its first chunk only: 2 blocks, not 11
    at = steps[np.isclose(steps["start"], admitted)]
    assert int(at["kv_used_blocks"].iloc[0]) == 2


@pytest.mark.parametrize("bad", ["reserve", "full", ""])
def test_an_unknown_admission_rule_is_a_config_error(bad):
    with pytest.raises(Exception, match="admission"):
        policies.create_policy({"name": "continuous", "admission": bad})


# -- vLLM V0's admission watermark and SGLang's retraction victim -------------------------------------

def _two(prompts, outputs) -> Workload:
    return Workload(arrival=np.zeros(len(prompts)), prompt_tokens=np.array(prompts, np.int64),
                    output_tokens=np.array(outputs, np.int64))


def test_watermark_keeps_blocks_free_at_admission():
    # 10 blocks of 4 tokens. A's 16-token prompt takes 4, B's 24-token prompt 6: 10, all of them.
    # With watermark 0.1 (int(0.1 x 10) = 1 block kept free) B needs 6 + 1 > 6 left and waits for A.
    wl = _two([16, 24], [8, 4])
    req, steps, _, _ = _run("step", wl, blocks=10)
    assert int(steps["num_seqs"].iloc[0]) == 2
    req, steps, _, _ = _run("step", wl, blocks=10, watermark=0.1)
    assert (req["status"] == "completed").all() and req["preemptions"].sum() == 0
    assert int(steps["num_seqs"].iloc[0]) == 1
    a, b = req.sort_values("rid").itertuples()
    assert b.admitted >= a.completion - 1e-12
    # running sequences' growth ignores the watermark: A alone may fill every block but the ones B's wait left
    assert int(steps["kv_used_blocks"].max()) <= 10


def test_a_prompt_that_can_never_leave_the_watermark_free_is_rejected():
    # int(0.3 x 10) = 3 blocks kept: a 32-token prompt (8 blocks) could never be admitted (vLLM V0 NEVER),
    # though its 36 tokens to completion (9 blocks) fit the cache, so the replica accepted it
    req, *_ = _run("step", _two([32, 8], [4, 4]), blocks=10, watermark=0.3)
    rows = req.sort_values("rid")
    assert list(rows["status"]) == ["rejected", "completed"]
    assert rows["reason"].iloc[0] == ("32 tokens need 8 KV blocks but only 7 of the 10 may be allocated at "
                                      "admission (the watermark keeps 3 free)")


@pytest.mark.parametrize("rule", ["remaining", "completion"])
def test_the_watermark_rejects_by_what_the_rule_holds(rule):
    # 8 + 30 tokens fill all 10 blocks of 4 (the replica accepts it); watermark 0.1 keeps 1 free. 'step' admits it
    # on its prompt, but 'remaining' and 'completion' ask for all 38 tokens at admission: never, so it is rejected
    # rather than left waiting (and blocking the queue) forever.
    req, *_ = _run(rule, _two([8, 4], [30, 4]), blocks=10, watermark=0.1)
    rows = req.sort_values("rid")
    assert list(rows["status"]) == ["rejected", "completed"]
    assert rows["reason"].iloc[0].startswith("38 tokens need 10 KV blocks but only 9 of the 10")
    req, *_ = _run("step", _two([8, 4], [30, 4]), blocks=10, watermark=0.1)
    assert (req["status"] == "completed").all()


def test_fewest_decoded_retracts_from_the_whole_decode_batch_before_scheduling():
    # A (30-token prompt) and B (4) finish their prompts in one step and decode in lockstep, tied on generated
    # tokens, until 61 one-token blocks run out. SGLang's retract_decode sorts the whole batch first and retracts
    # the longest prompt on the tie (A); vLLM's rule would schedule A (the oldest) and preempt B.
    spec = {"name": "chunked_prefill", "max_num_seqs": 8, "max_num_batched_tokens": 24, "prefill_mode": "separate"}
    wl = _two([30, 4], [20, 20])
    got = {}
    for victim in ("fewest_decoded", "last_admitted"):
        req, *_ = run_engine(lambda: policies.create_policy(dict(spec, victim=victim)), wl, cost=ConstantCost(0.01),
                             kv_blocks=61, block_size=1)
        rows = req.sort_values("rid")
        assert (rows["status"] == "completed").all()
        got[victim] = list(rows["preemptions"] > 0)
    assert got == {"fewest_decoded": [True, False], "last_admitted": [False, True]}


@pytest.mark.parametrize("victim,preempted", [("last_admitted", 1), ("fewest_decoded", 0)])
def test_the_victim_rule_picks_who_is_preempted(victim, preempted):
    # A (12-token prompt) and B (4) are admitted together and decode in lockstep until the 10 blocks run out.
    # vLLM preempts the last admitted (B); SGLang retracts the fewest decoded, the longest prompt on ties (A).
    req, *_ = _run("step", _two([12, 4], [20, 20]), blocks=10, victim=victim)
    rows = req.sort_values("rid")
    assert (rows["status"] == "completed").all()
    assert list(rows["preemptions"] > 0) == [i == preempted for i in range(2)]


def test_fewest_decoded_orders_by_generated_then_prompt_then_newest():
    from types import SimpleNamespace as S

    from batchsim.policies.ordering import fewest_decoded
    run = [S(rid=0, num_generated=3, prompt_tokens=5), S(rid=1, num_generated=2, prompt_tokens=5),
           S(rid=2, num_generated=2, prompt_tokens=9), S(rid=3, num_generated=2, prompt_tokens=9),
           S(rid=4, num_generated=4, prompt_tokens=50)]
    assert fewest_decoded(run).rid == 3
    assert fewest_decoded(run[:3]).rid == 2
    assert fewest_decoded(run[:2]).rid == 1


@pytest.mark.parametrize("knob,bad", [("watermark", 1.0), ("watermark", -0.1), ("victim", "oldest")])
def test_bad_watermark_or_victim_is_a_config_error(knob, bad):
    with pytest.raises(Exception, match=knob):
        policies.create_policy({"name": "continuous", knob: bad})


# -- SGLang's admission: remaining output counted, not allocated ----------------------------------------

def test_remaining_counts_running_outputs_without_allocating_them():
    # 4 requests of 8 prompt + 8 output tokens, 10 blocks of 4: to completion each needs 4 blocks, so two fit.
    # 'remaining' admits exactly the two that 'completion' admits, but allocates only their prompts (2 blocks
    # each) and lets them grow into what was counted; nobody is preempted, as with 'completion'.
    wl = _wl(4, 8, 8)
    req, steps, _, _ = _run("remaining", wl, blocks=10)
    assert (req["status"] == "completed").all() and req["preemptions"].sum() == 0
    assert int(steps["num_seqs"].iloc[0]) == 2
    assert int(steps["kv_used_blocks"].iloc[0]) == 4  # 'completion' holds 8 here
    comp, *_ = _run("completion", wl, blocks=10)
    assert np.allclose(req.sort_values("rid")["admitted"], comp.sort_values("rid")["admitted"])


def test_remaining_clips_each_output_at_4096_tokens():
    # A: 8 + 5000 tokens, 1252 blocks of 4 to completion; B: 8 + 8. With 1254 blocks 'completion' must hold A's
    # 1252 and B waits for A; 'remaining' counts A's output only up to 4096 tokens (1026 blocks with its
    # prompt: SGLang's CLIP_MAX_NEW_TOKENS), so B is admitted beside A in the first step.
    wl = _two([8, 8], [5000, 8])
    firsts = {}
    for rule in ("completion", "remaining"):
        req, steps, _, _ = _run(rule, wl, blocks=1254)
        assert (req["status"] == "completed").all(), rule
        firsts[rule] = int(steps["num_seqs"].iloc[0])
    assert firsts == {"completion": 1, "remaining": 2}

