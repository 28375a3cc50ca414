"""Invariants of every policy over random small workloads (Hypothesis).

Each example drives a policy through :func:`tests.policy_fakes.simulate`,
whose ``apply`` raises wherever the engine would refuse a plan (KV
over-commit, a rid neither waiting nor running, a rid both preempted and
scheduled, more tokens than pending). On top of that, every plan must keep
the policy's own limits, and every request must end finished or rejected.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsim import policies
from tests.policy_fakes import FakeKV, FakeSeq, FakeView, simulate
from batchsim.sim.types import BatchPlan

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

requests = st.lists(
    st.tuples(st.integers(0, 12).map(lambda x: x * 0.5), st.integers(1, 24), st.integers(1, 8)),
    min_size=1, max_size=8,
)


@st.composite
def specs(draw) -> dict:
    name = draw(st.sampled_from(["static", "dynamic", "continuous", "chunked_prefill"]))
    spec = {"name": name}
    if name in ("static", "dynamic"):
        b = draw(st.integers(1, 4))
        spec.update(max_batch_size=b, complete_at=draw(st.sampled_from(["batch_end", "own_token"])))
        delay = draw(st.sampled_from([0.0, 0.5, 2.0]))
        if name == "static":
            spec["timeout_s"] = delay
        else:
            spec.update(max_queue_delay_s=delay, preferred_batch_sizes=draw(st.lists(st.integers(1, b), max_size=2)))
    else:
        seqs = draw(st.integers(1, 4))
        spec.update(max_num_seqs=seqs, max_num_batched_tokens=draw(st.integers(seqs, 32)),
                    order=draw(st.sampled_from(["fcfs", "shortest_prompt_first"])))
        if name == "continuous":
            spec["prefill_mode"] = draw(st.sampled_from(["separate", "mixed"]))
    return spec


def workload(reqs, block_size: int, spare: int) -> tuple[list[FakeSeq], FakeKV]:
    """Requests and a cache that fits the largest one alone (the engine rejects the rest at arrival)."""
    seqs = [FakeSeq(i, p, m, arrival=t) for i, (t, p, m) in enumerate(reqs)]
    blocks = max(math.ceil((s.prompt_tokens + s.max_tokens) / block_size) for s in seqs) + spare
    return seqs, FakeKV(block_size, blocks)


def limits_check(spec: dict):
    """A ``check(plan, view)`` that asserts the policy's own limits on every plan."""
    cfg = policies.create_policy(spec).config

    def check(plan: BatchPlan, view: FakeView) -> None:
        waiting = {s.rid: s for s in view.waiting}
        running = {s.rid: s for s in view.running}
        sched = set(plan.num_tokens)
        assert sched <= waiting.keys() | running.keys()
        assert not sched & set(plan.preempt)
        assert not sched & set(plan.reject)
        admitted = sched & waiting.keys()
        if spec["name"] in ("static", "dynamic"):
            assert not plan.preempt and not plan.reject
            assert len(view.running) - len(plan.release) + len(admitted) <= cfg.max_batch_size
            assert not admitted or set(plan.release) == running.keys()  # a batch launches on an idle replica
        else:
            assert plan.total_tokens <= cfg.max_num_batched_tokens
            stay = len(view.running) - len(plan.preempt) - len(plan.release)
            assert stay + len(admitted) <= cfg.max_num_seqs
            for rid in plan.reject:
                assert spec["name"] == "continuous" and waiting[rid].pending > cfg.max_num_batched_tokens
        if spec.get("prefill_mode") == "separate" and admitted:
            assert sched == admitted  # a prefill step pauses the decodes
        if spec["name"] == "chunked_prefill":
            rows = [running[r].in_prefill if r in running else True for r in plan.num_tokens]
            assert rows == sorted(rows)  # decodes first

    return check


@SETTINGS
@given(spec=specs(), reqs=requests, block_size=st.integers(1, 8), spare=st.integers(0, 6))
def test_every_plan_keeps_the_limits_and_every_request_ends(spec, reqs, block_size, spare):
    seqs, kv = workload(reqs, block_size, spare)
    spec["block_size"] = block_size
    run = simulate(policies.create_policy(spec), seqs, kv, check=limits_check(spec))
    assert not run.stuck
    assert set(run.finished) | set(run.rejected) == {s.rid for s in seqs}
    assert not set(run.finished) & set(run.rejected)
    assert not kv.held  # every block returned
    for s in run.finished.values():
        assert s.num_generated == s.max_tokens and s.completion is not None


@settings(max_examples=40, deadline=None)
@given(spec=specs(), reqs=requests, block_size=st.integers(1, 8), spare=st.integers(0, 6))
def test_policies_are_deterministic(spec, reqs, block_size, spare):
    runs = []
    for _ in range(2):
        seqs, kv = workload(reqs, block_size, spare)
        runs.append(simulate(policies.create_policy(spec), seqs, kv).plans)
    assert runs[0] == runs[1]


@SETTINGS
@given(reqs=requests, b=st.integers(1, 4))
def test_batch_end_completes_a_static_batch_together(reqs, b):
    seqs, kv = workload(reqs, 4, 2)
    run = simulate(policies.create_policy({"name": "static", "max_batch_size": b}), seqs, kv)
    launched = [list(p.num_tokens) for p in run.plans if p.reserve]
    for batch in launched:
        assert len({run.finished[r].completion for r in batch}) == 1
