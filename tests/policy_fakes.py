"""Plain fake objects for testing policies without SimPy.

:class:`FakeSeq`, :class:`FakeKV` and :class:`FakeView` implement the
:mod:`batchsim.sim.protocols` views with dataclasses. :func:`apply` plays the engine's
part for one plan, in the contract's order (release, reject, preempt, admit
and grow KV, then run the step), and raises :class:`ContractError` wherever
the real engine would refuse the plan. :func:`simulate` drives a policy over
a list of arrivals with a fixed step time, for multi-step and property tests.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from batchsim.policies.base import PolicyConfig
from batchsim.sim.types import BatchPlan

__all__ = ["ContractError", "FakeSeq", "FakeKV", "FakeView", "make_view", "decoding", "apply", "simulate", "Run",
           "OneAtATime"]


class ContractError(AssertionError):
    """A plan the engine would refuse (a policy bug)."""


@dataclass
class FakeSeq:
    """A sequence as the engine keeps it; ``num_tokens`` defaults to the prompt."""

    rid: int
    prompt_tokens: int
    max_tokens: int
    arrival: float = 0.0
    num_tokens: int = 0
    num_computed: int = 0
    num_generated: int = 0
    num_preemptions: int = 0
    finished: bool = False
    completion: float | None = None

    def __post_init__(self) -> None:
        if self.num_tokens == 0:
            self.num_tokens = self.prompt_tokens + self.num_generated

    @property
    def pending(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def in_prefill(self) -> bool:
        return self.num_generated == 0 or self.pending > 1


def decoding(rid: int, prompt: int, max_tokens: int, generated: int = 1, **kw) -> FakeSeq:
    """A running sequence past its prefill: ``generated`` tokens out, one pending."""
    n = prompt + generated
    return FakeSeq(rid, prompt, max_tokens, num_tokens=n, num_computed=n - 1, num_generated=generated, **kw)


@dataclass
class FakeKV:
    """Counts blocks held per rid, like the engine's paged allocator."""

    block_size: int
    total_blocks: int
    held: dict[int, int] = field(default_factory=dict)

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - sum(self.held.values())

    def blocks_needed(self, seq, total_tokens: int) -> int:
        return max(0, math.ceil(total_tokens / self.block_size) - self.held.get(seq.rid, 0))

    def grow(self, rid: int, total_tokens: int) -> None:
        want = math.ceil(total_tokens / self.block_size)
        extra = want - self.held.get(rid, 0)
        if extra <= 0:
            return
        if extra > self.free_blocks:
            raise ContractError(f"rid {rid} needs {extra} more blocks, {self.free_blocks} free")
        self.held[rid] = want

    def free(self, rid: int) -> None:
        self.held.pop(rid, None)


@dataclass
class FakeView:
    """What a policy reads; ``waiting`` is a deque as in the engine."""

    kv: FakeKV
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    now: float = 0.0
    max_model_len: int = 1 << 20


def make_view(waiting: Iterable[FakeSeq] = (), running: Iterable[FakeSeq] = (), *, blocks: int = 100,
              block_size: int = 16, now: float = 0.0, reserve: int = 0) -> FakeView:
    """A view whose running sequences hold blocks for ``max(reserve, num_computed)`` tokens."""
    kv = FakeKV(block_size, blocks)
    running = list(running)
    for s in running:
        kv.held[s.rid] = math.ceil(max(reserve, s.num_computed) / block_size)
    if kv.free_blocks < 0:
        raise ValueError("running sequences hold more blocks than the cache has")
    return FakeView(kv=kv, waiting=deque(waiting), running=running, now=now)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ContractError(msg)


def _before_step(plan: BatchPlan, view: FakeView) -> None:
    """Release, reject, preempt, admit and grow KV, in the engine's order."""
    running = {s.rid: s for s in view.running}
    waiting = {s.rid: s for s in view.waiting}
    sched = set(plan.num_tokens)
    _check(not sched & set(plan.preempt), f"rids both preempted and scheduled: {sched & set(plan.preempt)}")
    _check(not sched & set(plan.release), f"rids both released and scheduled: {sched & set(plan.release)}")
    for rid in plan.release:
        _check(rid in running and running[rid].finished, f"released rid {rid} is not a finished running seq")
        view.running.remove(running[rid])
        view.kv.free(rid)
        if plan.complete_on_release:
            running[rid].completion = view.now
    for rid in plan.reject:
        _check(rid in waiting, f"rejected rid {rid} is not waiting")
        view.waiting.remove(waiting[rid])
    victims = [running[rid] for rid in plan.preempt if rid in running]
    _check(len(victims) == len(plan.preempt), f"preempted rids {plan.preempt} are not all running")
    for s in victims:
        _check(not s.finished, f"preempted rid {s.rid} has finished")
        view.running.remove(s)
        view.kv.free(s.rid)
        s.num_computed = 0
        s.num_preemptions += 1
    view.waiting.extendleft(reversed(victims))
    for rid, q in plan.num_tokens.items():
        s = running.get(rid)
        if s is None or rid in plan.preempt:
            s = next((w for w in view.waiting if w.rid == rid), None)
            _check(s is not None, f"scheduled rid {rid} is neither waiting nor running")
            view.waiting.remove(s)
            view.running.append(s)
        _check(not s.finished, f"scheduled rid {rid} has finished")
        _check(1 <= q <= s.pending, f"rid {rid} scheduled {q} tokens with {s.pending} pending")
        view.kv.grow(rid, max(plan.reserve.get(rid, 0), s.num_computed + q))
    for q, kv, _ in plan.padding:
        _check(q >= 1 and kv >= 0, f"bad padding row {(q, kv)}")


def _run_step(plan: BatchPlan, view: FakeView) -> list[FakeSeq]:
    """Advance tokens; finished sequences leave unless held. Returns those that finished."""
    by_rid = {s.rid: s for s in view.running}
    done = []
    for rid, q in plan.num_tokens.items():
        s = by_rid[rid]
        s.num_computed += q
        if s.num_computed == s.num_tokens:
            s.num_generated += 1
            s.num_tokens += 1
            if s.num_generated >= s.max_tokens:
                s.finished, s.completion = True, view.now
                done.append(s)
    if not plan.hold_finished:
        for s in done:
            view.running.remove(s)
            view.kv.free(s.rid)
    return done


def apply(plan: BatchPlan, view: FakeView, step_s: float = 1.0) -> list[FakeSeq]:
    """Apply ``plan`` as the engine would and, if it schedules anything, run the step.

    The step takes ``step_s``: ``view.now`` advances and finishing sequences
    are stamped with the step's end. Returns the sequences that finished.
    """
    _before_step(plan, view)
    if not plan.num_tokens:
        return []
    view.now += step_s
    return _run_step(plan, view)


@dataclass
class Run:
    """What :func:`simulate` saw."""

    plans: list[BatchPlan] = field(default_factory=list)
    finished: dict[int, FakeSeq] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    stuck: bool = False


def simulate(policy, seqs: list[FakeSeq], kv: FakeKV, *, step_s: float = 1.0, max_plans: int = 5000,
             check: Callable[[BatchPlan, FakeView], None] | None = None) -> Run:
    """Drive ``policy`` until every request has finished or been rejected.

    Arrivals join the queue when ``now`` reaches them; a plan that schedules
    nothing sleeps until the next arrival or its ``idle_until``, unless it
    released, rejected or preempted (then the policy is asked again at once,
    as the engine does). ``check(plan, view)`` sees
    each plan with the view it was made from. ``stuck`` is set if the policy
    idles forever with work left or runs out of ``max_plans``.
    """
    arrivals = deque(sorted(seqs, key=lambda s: (s.arrival, s.rid)))
    view, run = FakeView(kv=kv), Run()
    while arrivals or view.waiting or view.running:
        if len(run.plans) >= max_plans:
            run.stuck = True
            break
        while arrivals and arrivals[0].arrival <= view.now:
            view.waiting.append(arrivals.popleft())
        plan = policy.schedule(view)
        if check is not None:
            check(plan, view)
        run.plans.append(plan)
        run.rejected.update(plan.reject)
        released = [s for s in view.running if s.rid in plan.release]
        done = apply(plan, view, step_s)
        left = released + ([] if plan.hold_finished else done)
        run.finished.update((s.rid, s) for s in left)
        if plan.num_tokens or plan.release or plan.reject or plan.preempt:
            continue  # after a step, or a plan that changed state without one, the engine asks again
        _check(plan.idle_until is None or plan.idle_until > view.now, f"idle_until {plan.idle_until} <= now")
        wake = min(arrivals[0].arrival if arrivals else math.inf, plan.idle_until or math.inf)
        if wake == math.inf:
            run.stuck = bool(view.waiting or view.running)
            break
        view.now = wake
    return run



class OneAtATime:
    """A minimal outside policy, loadable as ``tests.policy_fakes:OneAtATime``:
    runs the oldest request alone, whole prompt then decodes."""

    Config = PolicyConfig
    name = "one_at_a_time"

    def __init__(self, config) -> None:
        self.config = config

    def schedule(self, view) -> BatchPlan:
        if view.running:
            return BatchPlan(num_tokens={view.running[0].rid: view.running[0].pending})
        if view.waiting:
            return BatchPlan(num_tokens={view.waiting[0].rid: view.waiting[0].pending})
        return BatchPlan()
