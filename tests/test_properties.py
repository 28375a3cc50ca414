"""Property tests: random workloads x every policy keep the engine's invariants.

Every request ends completed, rejected or unfinished; completed requests got
exactly their output tokens; KV in use stays within [0, capacity]; token
budgets and sequence limits hold; arrival <= first token <= completion; time
never goes backwards; with no horizon nothing is left unfinished (liveness).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsim import policies
from tests.engine_helpers import ConstantCost, run_engine, workload

ADMISSIONS = st.sampled_from(["step", "step", "sequence", "completion", "remaining"])
POLICY_SPECS = st.one_of(
    st.builds(lambda b, t: {"name": "static", "max_batch_size": b, "timeout_s": t},
              st.integers(1, 6), st.sampled_from([0.0, 0.3, 2.0])),
    st.builds(lambda b, d: {"name": "dynamic", "max_batch_size": b, "max_queue_delay_s": d,
                            "preferred_batch_sizes": [1, b] if b > 1 else []},
              st.integers(1, 6), st.sampled_from([0.0, 0.1, 1.0])),
    st.builds(lambda s, t, m, a: {"name": "continuous", "max_num_seqs": s, "max_num_batched_tokens": t,
                                  "prefill_mode": m, "admission": a},
              st.integers(1, 8), st.integers(64, 400), st.sampled_from(["separate", "mixed"]), ADMISSIONS),
    st.builds(lambda s, t, a, w, v: {"name": "chunked_prefill", "max_num_seqs": s, "max_num_batched_tokens": t,
                                     "admission": a, "watermark": w, "victim": v},
              st.integers(1, 8), st.integers(8, 128), ADMISSIONS, st.sampled_from([0.0, 0.0, 0.01, 0.2]),
              st.sampled_from(["last_admitted", "fewest_decoded"])),
)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 25))
    gaps = draw(st.lists(st.floats(0, 2.0), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    return workload(np.cumsum(gaps), prompts, outputs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=POLICY_SPECS, wl=workloads(), blocks=st.integers(8, 120), bs=st.sampled_from([4, 8, 16]),
       horizon=st.sampled_from([None, None, 5.0]))
def test_invariants_hold_for_every_policy(spec, wl, blocks, bs, horizon):
    req, steps, itl, cluster = run_engine(
        lambda: policies.create_policy(spec), wl, cost=ConstantCost(0.05, per_token=0.001),
        kv_blocks=blocks, block_size=bs, horizon=horizon)
    # accounting: every request is in exactly one terminal state
    arrived = len(wl) if horizon is None else int((wl.arrival < horizon).sum())
    assert len(req) == arrived
    assert set(req["status"]) <= {"completed", "rejected", "unfinished"}
    done = req[req["status"] == "completed"]
    assert (done["generated_tokens"] == done["output_tokens"]).all()
    assert (done["arrival"] <= done["first_token"]).all()
    assert (done["first_token"] <= done["completion"]).all()
    if horizon is None:
        assert (req["status"] != "unfinished").all(), req[req["status"] == "unfinished"]
        assert cluster.replicas[0].kv.used_blocks == 0
    # KV within capacity
    assert (steps["kv_used_blocks"] >= 0).all() and (steps["kv_used_blocks"] <= blocks).all()
    # time never goes backwards
    assert (np.diff(steps["start"].to_numpy()) >= 0).all()
    assert (steps["end"] >= steps["start"]).all()
    # budgets
    useful = steps["prefill_tokens"] + steps["decode_tokens"]
    if spec["name"] in ("continuous", "chunked_prefill"):
        assert (useful <= spec["max_num_batched_tokens"]).all()
        assert (steps["num_seqs"] <= spec["max_num_seqs"]).all()
    else:
        # padding rows: one per member shorter than the longest prompt, or per dead slot
        assert (steps["num_seqs"] <= spec["max_batch_size"]).all()
        assert (steps["num_rows"] <= 2 * spec["max_batch_size"]).all()
    assert (itl["gap"] > 0).all()
