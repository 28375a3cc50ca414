"""Planning a step while the one before it runs (``schedule_ahead``), worked by hand.

vLLM's async scheduling, SGLang's and TensorRT-LLM's overlap schedulers schedule
step k+1 while step k runs and process step k's outputs after that: a request
that reaches the replica during step k joins step k+2, and the KV that step k's
finished requests free is seen by the plan of step k+2. With every step 10 ms
long the times below are exact multiples of 10 ms. Both engines run the rule
(tests/test_core.py compares them on the cases and random scenarios).
"""

from __future__ import annotations

import numpy as np
import pytest

from batchsim import policies
from batchsim.sim.types import Workload
from tests.engine_helpers import ConstantCost, run_engine

STEP = 0.01


def _run(wl: Workload, ahead: bool, blocks: int = 64, name: str = "continuous", **kw):
    spec = {"name": name, "max_num_seqs": 8, "max_num_batched_tokens": 64, "schedule_ahead": ahead, **kw}
    req, steps, _, _ = run_engine(lambda: policies.create_policy(spec), wl, cost=ConstantCost(STEP),
                                  kv_blocks=blocks, block_size=4)
    return req.sort_values("rid").reset_index(drop=True), steps


def _wl(arrival, prompt, output) -> Workload:
    return Workload(arrival=np.asarray(arrival, float), prompt_tokens=np.asarray(prompt, np.int64),
                    output_tokens=np.asarray(output, np.int64))


@pytest.mark.parametrize("name", ["continuous", "chunked_prefill"])
def test_a_request_arriving_mid_step_joins_the_step_after_next(name):
    # A runs alone from t=0 (steps end at 10, 20, 30 ... ms); B arrives at 15 ms, during A's second step.
    wl = _wl([0.0, 0.015], [8, 8], [10, 3])
    now, _ = _run(wl, False, name=name)
    ahead, _ = _run(wl, True, name=name)
    # without: B is planned when the step running at its arrival ends (20 ms), its first token at 30 ms
    assert now["admitted"][1] == pytest.approx(0.02) and now["first_token"][1] == pytest.approx(0.03)
    # ahead: the step from 20 to 30 ms was planned at 10 ms, before B arrived; B joins the next one
    assert ahead["admitted"][1] == pytest.approx(0.03) and ahead["first_token"][1] == pytest.approx(0.04)
    # A, alone or not, is unchanged: its steps were never waiting for B
    assert ahead["completion"][0] == pytest.approx(now["completion"][0])


def test_an_idle_replica_plans_an_arrival_at_once():
    # nothing runs when B arrives: nothing was planned ahead, so B starts at its arrival
    wl = _wl([0.0, 0.5], [8, 8], [2, 2])
    ahead, _ = _run(wl, True)
    assert ahead["admitted"][1] == pytest.approx(0.5) and ahead["first_token"][1] == pytest.approx(0.51)


def test_kv_a_step_frees_is_seen_one_plan_later():
    # A (8 + 4 tokens) and B (8 + 4) each need 3 blocks at most, with 4 blocks of 4 tokens: B waits for A.
    # 'completion' admission reserves 3 blocks for A, so B (3 more) is admitted only once A's are free.
    wl = _wl([0.0, 0.0], [8, 8], [4, 4])
    now, _ = _run(wl, False, blocks=4, admission="completion")
    ahead, steps = _run(wl, True, blocks=4, admission="completion")
    a_done = now["completion"][0]
    assert a_done == pytest.approx(0.04)  # prefill + first token, then 3 decodes
    assert now["admitted"][1] == pytest.approx(a_done)  # planned when A's last step ends
    # ahead: the step after A's last was planned while A still held its blocks; that plan finds
    # nothing to run, so the replica takes the freed blocks at once and admits B with no step lost
    assert ahead["admitted"][1] == pytest.approx(a_done)
    assert ahead["completion"][1] == pytest.approx(now["completion"][1])


def test_freed_kv_waits_a_step_while_others_run():
    # 7 blocks of 4 tokens, 'completion' admission: A (8 + 4 tokens, 3 blocks) and B (8 + 8, 4 blocks) fill
    # them; C (3 blocks) waits for A's. B keeps the replica busy, so a plan is always in hand.
    wl = _wl([0.0, 0.0, 0.0], [8, 8, 8], [4, 8, 4])
    now, _ = _run(wl, False, blocks=7, admission="completion")
    ahead, _ = _run(wl, True, blocks=7, admission="completion")
    a_done = now["completion"][0]
    assert a_done == pytest.approx(0.04) and ahead["completion"][0] == pytest.approx(a_done)
    assert now["admitted"][2] == pytest.approx(a_done)  # planned when A's last step ends, A's blocks free
    # ahead: the step from 40 to 50 ms was planned while A held its blocks (B alone); C joins the next
    assert ahead["admitted"][2] == pytest.approx(a_done + STEP)
    assert ahead["first_token"][2] == pytest.approx(now["first_token"][2] + STEP)


def test_queue_limits_and_step_records_count_the_inbox():
    # three arrive during A's first step: with ahead they wait unseen, and still fill a 2-request queue
    wl = _wl([0.0, 0.005, 0.006, 0.007], [8] * 4, [5] * 4)
    spec = {"name": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 64, "schedule_ahead": True}
    req, steps, _, _ = run_engine(lambda: policies.create_policy(spec), wl, cost=ConstantCost(STEP),
                                  kv_blocks=64, block_size=4, max_queue_len=2)
    req = req.sort_values("rid").reset_index(drop=True)
    assert list(req["status"]) == ["completed", "completed", "completed", "rejected"]
    assert "queue full" in req["reason"][3]
    # the first step's record counts the two waiting in the inbox
    assert int(steps["waiting"].iloc[0]) == 2


def test_schedule_ahead_must_be_a_bool():
    with pytest.raises(Exception, match="schedule_ahead"):
        policies.create_policy({"name": "continuous", "schedule_ahead": "sometimes"})
