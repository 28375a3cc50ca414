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
