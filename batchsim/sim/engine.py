"""The SimPy kernel: an arrival process, a router and one process per replica.

A replica's loop is the whole engine: ask the policy for a plan, apply its
admission part (release, reject, preempt, admit and grow KV), build the
step's shape, price it, ``yield env.timeout(seconds)``, then apply the result
(tokens advance, first tokens and completions are stamped, KV is freed) and
record the step. One SimPy event per step and no policy logic here. This is
the reference: the compiled core (batchsim/core/_core.c) reproduces it event for event
for the built-in policies.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable, Sequence

import numpy as np
import simpy

from batchsim.sim.frontend import InServers, delivered_at
from batchsim.sim.kv import PagedKVCache
from batchsim.sim.protocols import CostModel, Policy, PolicyError
from batchsim.sim.itl import TokenSteps
from batchsim.sim.records import StepStream
from batchsim.sim.state import COMPLETED, REJECTED, Seq
from batchsim.sim.types import BatchPlan, StepShape, Workload

__all__ = ["Replica", "Cluster", "PolicyError", "too_long", "over_kv", "queue_full"]


# Why the engine rejects a request (the compiled core's records give the same words: batchsim.core)
# ``what``: what the total counts (a disaggregated prefill pool runs the prompt and its first token)
def too_long(total: int, max_model_len: int, what: str = "prompt+output") -> str:
    return f"{what} {total} > max_model_len {max_model_len}"


def over_kv(total: int, capacity_tokens: int, what: str = "prompt+output") -> str:
    return f"{what} {total} tokens > KV capacity {capacity_tokens}"


def queue_full(max_queue_len: int) -> str:
    return f"queue full ({max_queue_len} waiting)"


class _View:
    """The read-only window a policy gets onto its replica."""

    __slots__ = ("_env", "waiting", "running", "kv", "max_model_len")

    def __init__(self, env, waiting, running, kv, max_model_len) -> None:
        self._env, self.waiting, self.running = env, waiting, running
        self.kv, self.max_model_len = kv, max_model_len

    @property
    def now(self) -> float:
        return self._env.now


class Replica:
    """One model replica: a policy, a KV cache and a cost model."""

    def __init__(self, env: simpy.Environment, index: int, policy: Policy, cost: CostModel,
                 kv: PagedKVCache, max_model_len: int, steps: StepStream, itl: TokenSteps) -> None:
        self.env, self.index, self.policy, self.cost, self.kv = env, index, policy, cost, kv
        self.max_model_len = max_model_len
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        # (a plan ``ahead``: requests that reached the replica while its step ran, seen from the step
        # after, and the sequences that step finished, whose KV is freed once the next plan is applied)
        self.inbox: deque[Seq] = deque()
        self._deferred: list[Seq] = []
        self._ahead = False  # a step planned ahead is running
        self.seqs: dict[int, Seq] = {}
        self.steps, self.itl = steps, itl
        self.view = _View(env, self.waiting, self.running, kv, max_model_len)
        self.outstanding = 0  # admitted to this replica and not yet done (what routers balance)
        self.on_done: Callable[[Seq], None] | None = None  # told when a request ends (a closed loop's clients)
        # (a disaggregated deployment's prefill pool: told of each finished sequence, whose KV then
        # stays until release_kv; its decode pool: told after each plan applied, when KV may have
        # been freed. batchsim.sim.disagg)
        self.handoff: Callable[[Seq], None] | None = None
        self.after_plan: Callable[["Replica"], None] | None = None
        self.counted = "prompt+output"  # what a refusal says its total counts (too_long, over_kv)
        self.step_start = 0.0  # when the step now running (or the last one) began
        self._admissions = 0
        self._frontend = getattr(cost, "frontend", None)  # (in, in per token, out per step, out per token) s
        self._out_free = 0.0  # when the frontend has streamed every earlier step's tokens
        self._wake: simpy.Event | None = None
        self.process = env.process(self._loop())

    # -- arrivals -------------------------------------------------------------
    @property
    def queued(self) -> int:
        """Requests waiting at this replica, seen by its policy or not yet (what routers and
        queue limits count)."""
        return len(self.waiting) + len(self.inbox)

    def enqueue(self, seq: Seq) -> None:
        """Accept a routed request (or reject one that can never fit)."""
        seq.replica = self.index
        why = self.refusal(seq)
        if why is not None:
            return self.reject(seq, why)
        self.seqs[seq.rid] = seq
        (self.inbox if self._ahead else self.waiting).append(seq)
        self.outstanding += 1
        self._wake_up()

    def _wake_up(self) -> None:
        """End an idle wait (new work, or KV freed): the loop plans again."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _let_go(self, seq: Seq) -> None:
        """A finished sequence leaves: its KV is freed, or, with a ``handoff``, stays until release_kv."""
        if self.handoff is None:
            self.kv.free(seq.rid)
        else:
            self.handoff(seq)

    def refusal(self, seq: Seq) -> str | None:
        """Why this replica can never run ``seq`` (longer than max_model_len, or more KV than it has),
        or None."""
        total = seq.prompt_tokens + seq.output_tokens
        if total > self.max_model_len:
            return too_long(total, self.max_model_len, self.counted)
        if self.kv.blocks_needed(seq, total) > self.kv.total_blocks:
            return over_kv(total, self.kv.total_blocks * self.kv.block_size, self.counted)
        return None

    def release_kv(self, rid: int) -> None:
        """Free the KV a handed-off sequence left behind (its transfer is done) and wake the loop."""
        self.kv.free(rid)
        self._wake_up()

    def reject(self, seq: Seq, reason: str) -> None:
        """Mark ``seq`` rejected: it leaves without running."""
        seq.status, seq.reason = REJECTED, reason
        if self.on_done is not None:
            self.on_done(seq)

    # -- the loop -------------------------------------------------------------
    def _loop(self):
        env = self.env
        admin_only = 0
        while True:
            if self.kv.prefix_caching:
                self._peek()
            plan = self.policy.schedule(self.view)
            if not isinstance(plan, BatchPlan):
                raise PolicyError(f"{self.policy.name}: schedule() returned {type(plan).__name__}; "
                                  "expected a batchsim.sim.types.BatchPlan")
            preempted = self._admit(plan)
            freed = self._free_deferred()
            if not plan.num_tokens:
                if plan.release or plan.reject or plan.preempt:
                    # The plan changed state without a step: ask again now.
                    if self.after_plan is not None:
                        self.after_plan(self)
                    admin_only += 1
                    if admin_only > 100_000:
                        raise PolicyError(f"{self.policy.name}: no step after 100000 plans")
                    continue
                if freed or self.inbox:
                    # Nothing planned, and the last step's arrivals or freed KV not yet seen: with no
                    # step running, the host takes them now and plans again.
                    self._take_inbox()
                    if self.after_plan is not None:
                        self.after_plan(self)
                    continue
                yield from self._idle(plan)
                continue
            admin_only = 0
            shape, useful = self._grow_and_shape(plan)
            start = self.step_start = env.now
            if plan.ahead:
                # The next step is planned now, from what has reached the replica so far; what
                # arrives while this one runs waits in the inbox until this moment comes again.
                self._take_inbox()
                self._ahead = True
            cost = self.price(plan, shape)
            useful_flops = self.cost.price(useful).flops if useful is not None else cost.flops
            yield env.timeout(cost.seconds)
            self._ahead = False
            self._advance(plan, (useful if useful is not None else shape).sampled)
            self._record(plan, shape, cost, useful_flops, start, preempted)
            if self.after_plan is not None:
                self.after_plan(self)

    def _take_inbox(self) -> None:
        if self.inbox:
            self.waiting.extend(self.inbox)
            self.inbox.clear()

    def _free_deferred(self) -> bool:
        """Free the KV of the sequences the last step (planned ahead) finished: the plan just applied
        was made without it. True if there were any."""
        if not self._deferred:
            return False
        for seq in self._deferred:
            self.kv.free(seq.rid)
        self._deferred.clear()
        return True

    def price(self, plan: BatchPlan, shape: StepShape):
        """What the step costs. The reference executor (batchsim.calibrate.executor)
        overrides this to run the plan on a real model and time it."""
        return self.cost.price(shape)

    def _peek(self, depth: int = 256) -> None:
        # NOTE: only the head of the queue is looked up each round: policies
        # admit from the front, and a deep lookup per step would cost O(queue).
        kv = self.kv
        for i, seq in enumerate(self.waiting):
            if i >= depth:
                break
            seq.num_computed = 0  # waiting sequences hold no KV; re-count their cached prefix
            kv.peek(seq)

    def _idle(self, plan: BatchPlan):
        now = self.env.now
        self._wake = self.env.event()
        events = [self._wake]
        if plan.idle_until is not None:
            if plan.idle_until <= now:
                raise PolicyError(f"{self.policy.name}: idle_until {plan.idle_until} is not after now {now}")
            events.append(self.env.timeout(plan.idle_until - now))
        yield self.env.any_of(events)
        self._wake = None

    def _check_names(self, plan: BatchPlan) -> None:
        """Every rid a plan names is on this replica, and none is both rejected and scheduled."""
        seqs, name = self.seqs, self.policy.name
        for what, rids in (("scheduled", plan.num_tokens), ("rejected", plan.reject),
                           ("preempted", plan.preempt), ("released", plan.release)):
            for rid in rids:
                if rid not in seqs:
                    raise PolicyError(f"{name}: {what} rid {rid} is not waiting or running on this replica")
        for rid in plan.reject:
            if rid in plan.num_tokens:
                raise PolicyError(f"{name}: rid {rid} is both rejected and scheduled")

    def _admit(self, plan: BatchPlan) -> int:
        """Apply release, reject, preempt, then admit; returns how many were preempted."""
        now, seqs, kv = self.env.now, self.seqs, self.kv
        self._check_names(plan)
        for rid in plan.release:
            seq = seqs.pop(rid)
            if not seq.finished:
                raise PolicyError(f"{self.policy.name}: released rid {rid} has not finished")
            self.running.remove(seq)
            seq.is_running = False
            self._let_go(seq)
            if plan.complete_on_release:
                last = seq.last_token  # (the frontend may still be streaming its last token)
                seq.completion = last if last is not None and last > now else now
                if self.on_done is not None:
                    self.on_done(seq)  # (its response is returned now, with its batch's)
            self.outstanding -= 1
        if plan.reject:
            for rid, reason in plan.reject.items():
                seq = seqs.pop(rid)
                self.waiting.remove(seq)
                self.reject(seq, reason)
                self.outstanding -= 1
        if plan.preempt:
            victims = [seqs[rid] for rid in plan.preempt]
            for seq in victims:
                if not seq.is_running:
                    raise PolicyError(f"{self.policy.name}: preempted rid {seq.rid} is not running")
                seq.is_running = False
                self.running.remove(seq)
                kv.free(seq.rid)
                seq.num_computed = 0
                seq.num_preemptions += 1
            self.waiting.extendleft(reversed(victims))
        admitted = [s for s in map(seqs.__getitem__, plan.num_tokens) if not s.is_running]
        self._take_from_waiting(admitted)
        for seq in admitted:
            seq.is_running = True
            seq.order = self._admissions
            self._admissions += 1
            if seq.admitted is None:
                seq.admitted = now
        if kv.prefix_caching:
            # NOTE: pin every admission's cached prefix before any allocation,
            # so one admission's eviction can't take what peek promised another.
            for seq in admitted:
                kv.pin(seq)
        self.running.extend(admitted)
        return len(plan.preempt)

    def _take_from_waiting(self, admitted: list[Seq]) -> None:
        if not admitted:
            return
        waiting = self.waiting
        # NOTE: FCFS admissions are a prefix of the queue: pop them in O(k);
        # any other order falls back to one O(n) rebuild.
        k = len(admitted)
        if all(waiting[i] is admitted[i] for i in range(min(k, len(waiting)))) and k <= len(waiting):
            for _ in range(k):
                waiting.popleft()
            return
        ids = {id(s) for s in admitted}
        keep = [s for s in waiting if id(s) not in ids]
        if len(keep) + k != len(waiting):
            raise PolicyError(f"{self.policy.name}: scheduled a sequence that is neither waiting nor running")
        waiting.clear()
        waiting.extend(keep)

    def _grow_and_shape(self, plan: BatchPlan) -> tuple[StepShape, StepShape | None]:
        """Check each row, grow its KV and build the step's shape; with padding or
        billed context, also the useful rows' shape (for the useful FLOPs)."""
        seqs, kv, reserve = self.seqs, self.kv, plan.reserve
        ctx, sampled = [], 0
        for rid, q in plan.num_tokens.items():
            seq = seqs[rid]
            c = seq.num_computed
            total = c + q
            if q < 1 or total > seq.num_tokens:
                raise PolicyError(f"{self.policy.name}: rid {rid} scheduled {q} tokens with "
                                  f"{seq.pending} pending")
            kv.grow(rid, max(reserve.get(rid, 0), total) if reserve else total)
            ctx.append(c)
            if total == seq.num_tokens:
                sampled += 1
        pad, billed = plan.padding, plan.context
        q_arr = np.fromiter(plan.num_tokens.values(), dtype=np.int64, count=len(ctx))
        kv_arr = np.array(ctx, dtype=np.int64)
        if not pad and not billed:
            if plan.graph_tokens:  # (a CUDA graph's padding: the dense operators' extra tokens are not useful)
                return (StepShape(q=q_arr, kv=kv_arr, sampled=sampled, dense_tokens=plan.graph_tokens),
                        StepShape(q=q_arr, kv=kv_arr, sampled=sampled))
            return StepShape(q=q_arr, kv=kv_arr, sampled=sampled), None
        useful = StepShape(q=q_arr, kv=kv_arr, sampled=sampled)
        if billed:
            kv_arr = np.array([billed.get(rid, c) for rid, c in zip(plan.num_tokens, ctx)], dtype=np.int64)
        q_all = np.concatenate([q_arr, np.array([p[0] for p in pad], dtype=np.int64)])
        kv_all = np.concatenate([kv_arr, np.array([p[1] for p in pad], dtype=np.int64)])
        return StepShape(q=q_all, kv=kv_all, sampled=sampled + sum(1 for p in pad if p[2]),
                         dense_tokens=plan.graph_tokens), useful

    def _advance(self, plan: BatchPlan, sampled: int) -> None:
        """Apply a finished step: tokens advance, stamps (when the client has the ``sampled``
        tokens: batchsim.sim.frontend.delivered_at), completions."""
        now, seqs = self.env.now, self.seqs
        fe = self._frontend
        if fe is not None and sampled:
            now = self._out_free = delivered_at(now, self._out_free, sampled, fe[2], fe[3])
        prefix = self.kv.prefix_caching
        done, firsts = [], []
        # (this step's index among the replica's token steps, the steps in which some request gets a
        # token after its first, if it is one: batchsim.sim.itl)
        times, k, idx = self.itl.times, len(self.itl.times), self.index
        for rid, q in plan.num_tokens.items():
            seq = seqs[rid]
            c = seq.num_computed + q
            seq.num_computed = c
            if prefix and c - q < seq.prompt_tokens:
                self.kv.register(seq)
            if c != seq.num_tokens:
                continue
            g = seq.num_generated + 1
            seq.num_generated = g
            seq.num_tokens = c + 1
            last = seq.last_token
            if last is None:
                seq.first_token = now
                firsts.append(seq)
            else:
                gap = now - last
                if gap > seq.max_itl:
                    seq.max_itl = gap
                if len(times) == k:
                    times.append(now)
                run = seq.run
                if run is not None and run[0] == idx and run[2] == k - 1:  # the next token step: the run goes on
                    run[2] = k
                else:  # its first gap, or a token step missed (preempted, not scheduled): a run from this gap
                    if run is not None:
                        self.itl.closed.append((rid, *run))
                    seq.run = [idx, k, k, gap]
            seq.last_token = now
            if g >= seq.output_tokens:
                seq.finished = True
                seq.status = COMPLETED
                seq.completion = now
                if self.on_done is not None and not (plan.hold_finished and plan.complete_on_release):
                    self.on_done(seq)  # (its last token is out: the client has its response)
                if not plan.hold_finished:
                    done.append(seq)
        if firsts and len(times) > k:  # first tokens in a token step: their runs start with it
            for seq in firsts:
                seq.run = [idx, k, k, math.nan]
        for seq in done:
            seq.is_running = False
            self.running.remove(seq)
            if plan.ahead and self.handoff is None:
                self._deferred.append(seq)  # (the next step was planned with its KV held)
            else:
                self._let_go(seq)
            del seqs[seq.rid]
        self.outstanding -= len(done)

    def _record(self, plan, shape, cost, useful_flops, start, preempted) -> None:
        useful_q = shape.q[: len(plan.num_tokens)]
        kv_ctx = shape.kv[: len(plan.num_tokens)]
        decode = int(((useful_q == 1) & (kv_ctx > 0)).sum())
        prefill = int(useful_q.sum()) - decode
        padding = int(shape.q.sum()) - prefill - decode
        self.steps.append(
            self.index, start, self.env.now, len(plan.num_tokens), shape.num_rows,
            prefill, decode, padding, cost.flops, useful_flops,
            cost.bytes, cost.compute_s, cost.memory_s, cost.network_s, cost.overhead_s,
            cost.out_of_range, self.kv.used_blocks, self.queued, len(self.running), preempted,
        )


class Cluster:
    """Replicas behind a router, fed by the workload's arrivals."""

    def __init__(self, env: simpy.Environment, replicas: Sequence[Replica],
                 route: Callable[[Sequence[Replica], Seq], int], workload: Workload,
                 max_queue_len: int | None = None) -> None:
        self.env, self.replicas, self.route = env, list(replicas), route
        self.workload, self.max_queue_len = workload, max_queue_len
        self.requests: list[Seq] = []
        self._prompt, self._output = workload.prompt_tokens.tolist(), workload.output_tokens.tolist()
        # when each request reached the engine: the workload's times, or (a closed loop) as the clients
        # send them, past the frontend; ``sent``: when its client sent it
        self.arrival = np.full(len(workload), np.inf) if workload.closed is not None else workload.arrival
        self.sent = np.full(len(workload), np.inf) if workload.closed is not None else workload.arrival
        if workload.closed is None:
            env.process(self._arrivals())
        else:
            self._ended: dict[int, simpy.Event] = {}
            self._next = 0
            self._in = InServers(len(self.replicas))
            for r in self.replicas:
                r.on_done = self._end
            for _ in range(min(workload.closed.concurrency, len(workload))):
                env.process(self._client())

    def _arrivals(self):
        env, w = self.env, self.workload
        arrival = w.arrival.tolist()
        for rid in range(len(arrival)):
            t = arrival[rid]
            if t > env.now:
                yield env.timeout(t - env.now)
            self._send(rid, t)

    def _send(self, rid: int, t: float) -> Seq:
        w = self.workload
        hashes = w.prefix_hashes
        seq = Seq(rid, t, self._prompt[rid], self._output[rid], hashes[rid] if hashes is not None else None)
        self.requests.append(seq)
        replica = self.replicas[self.route(self.replicas, seq)]
        if self.max_queue_len is not None and replica.queued >= self.max_queue_len:
            seq.replica = replica.index
            replica.reject(seq, queue_full(self.max_queue_len))
            return seq
        replica.enqueue(seq)
        return seq

    # -- a closed loop ---------------------------------------------------------
    def _client(self):
        """One client: send the next unsent request, wait for its response, think, repeat."""
        env, think = self.env, self.workload.closed.think_s
        fe = getattr(self.replicas[0].cost, "frontend", None) if self.replicas else None
        while self._next < len(self.workload):
            rid = self._next
            self._next += 1
            ended = self._ended[rid] = env.event()
            self.sent[rid] = env.now
            if fe is not None:  # (through the frontend first: batchsim.sim.frontend)
                at = self._in.take(env.now, self._prompt[rid], fe[0], fe[1])
                if at > env.now:
                    yield env.timeout(at - env.now)
            self.arrival[rid] = env.now
            seq = self._send(rid, env.now)
            yield ended
            if seq.completion is not None and seq.completion > env.now:  # (still streaming)
                yield env.timeout(seq.completion - env.now)
            wait = float(think[rid])
            if wait > 0:
                yield env.timeout(wait)

    def _end(self, seq: Seq) -> None:
        ended = self._ended.pop(seq.rid, None)
        if ended is not None:
            ended.succeed()
