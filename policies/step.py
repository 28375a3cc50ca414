"""One iteration-level step, built under a token budget and the KV cache.

Continuous batching and chunked prefill differ only in how they fill a step
(vLLM's insight: there is no prefill phase, only computed tokens catching up
with known tokens). :class:`StepBuilder` holds what both need — the token
budget left, free KV blocks after this plan's own frees and allocations, free
sequence slots — and offers the three moves they compose:

- :meth:`StepBuilder.schedule_decodes`: every running decode gets one token;
  when the cache cannot hold the growth, preempt the most recently admitted
  running sequence, exactly vLLM v0's ``_schedule_running``.
- :meth:`StepBuilder.schedule_partial_prefills`: running sequences whose
  prompt is only partly computed get the next chunk (Sarathi-Serve).
- :meth:`StepBuilder.admit`: waiting sequences enter in queue order, whole
  prompt or first chunk, stopping at the first that does not fit.

KV is accounted cumulatively, so the engine can always grant the plan.

When the view offers a decode cohort (``view.cohort``, sim.cohort: the
running plain decodes as columns) and every running decode is in it,
:meth:`StepBuilder.schedule_decodes` schedules the whole cohort in O(1)
Python and marks the plan ``decode_cohort``; the builder then reads only
``view.others`` (the running sequences outside the cohort) unless it must
preempt, when it falls back to ``view.running`` and the one-by-one rules.
The plans are the same either way.
"""

from __future__ import annotations

from typing import Callable, Sequence

from pydantic import Field, ValidationInfo, field_validator

from policies.base import PolicyConfig, held_blocks
from policies.ordering import QueueOrder, last_admitted
from sim.protocols import ReplicaView, SeqView
from sim.types import BatchPlan

__all__ = ["IterationConfig", "StepBuilder", "over_budget"]


def over_budget(pending: int, cap: int) -> str:
    """Why a whole prompt is rejected (the compiled core's records give the same words: sim.core)."""
    return f"needs {pending} tokens in one step but max_num_batched_tokens is {cap}"


class IterationConfig(PolicyConfig):
    """Limits shared by the iteration-level policies (vLLM ``SchedulerConfig`` names)."""

    max_num_seqs: int = Field(256, ge=1, description="Most sequences running at once (vLLM --max-num-seqs).")
    max_num_batched_tokens: int = Field(
        8192, ge=1, description="Most tokens computed in one step (vLLM --max-num-batched-tokens).")
    order: QueueOrder = Field(
        "fcfs", description="Order in which waiting sequences are tried for admission; preempted ones stay first.")
    enable_prefix_caching: bool = Field(
        False, description="Share and reuse KV of identical prompt prefixes, LRU-evicted (vLLM "
                           "--enable-prefix-caching); needs prefix hashes in the workload.")

    @field_validator("max_num_batched_tokens")
    @classmethod
    def _budget_covers_decodes(cls, v: int, info: ValidationInfo) -> int:
        # Every running sequence must be able to decode in one step (vLLM's check).
        seqs = info.data.get("max_num_seqs")
        if seqs is not None and v < seqs:
            raise ValueError(f"max_num_batched_tokens ({v}) must be >= max_num_seqs ({seqs}) "
                             "so every running sequence can decode in each step")
        return v


class StepBuilder:
    """Accumulates one step's plan while tracking budget, KV blocks and slots."""

    def __init__(self, view: ReplicaView, max_num_batched_tokens: int, max_num_seqs: int,
                 victim: Callable[[Sequence[SeqView]], SeqView] = last_admitted) -> None:
        self.view = view
        self.cap = max_num_batched_tokens
        self.budget = max_num_batched_tokens
        self.free = view.kv.free_blocks
        self.victim = victim
        self.num_tokens: dict[int, int] = {}
        self.preempted: list[int] = []
        self.release: list[int] = []
        self.reject: dict[int, str] = {}
        self._decodes = -1  # how many decodes the fast path scheduled (-1: it did not)
        self._cohort_plan = False  # the plan's first rows are the whole cohort
        self._victims: tuple[int, ...] | None = None  # preempted, by admission order (_cohort_preempt)
        self.cohort = getattr(view, "cohort", None)
        # running, not finished, in admission order (with a cohort: outside it; the
        # cohort's members are plain decodes, never finished)
        running = view.running if self.cohort is None else view.others
        live = [s for s in running if not s.finished]
        if len(live) != len(running):
            for seq in running:
                if seq.finished:
                    # NOTE: iteration-level policies never hold finished sequences;
                    # should one be left running, let it go rather than leak its KV.
                    self.release.append(seq.rid)
                    self.free += held_blocks(view.kv, seq)
        self.others = live
        self._live: list[SeqView] | None = live if self.cohort is None else None  # (see live)
        self.n_live = len(live) + (len(self.cohort) if self.cohort is not None else 0)
        self.slots = max_num_seqs - self.n_live

    @property
    def live(self) -> list[SeqView]:
        """Running sequences, not finished, in admission order."""
        if self._live is None:
            self._live = [s for s in self.view.running if not s.finished]
        return self._live

    # -- primitives -------------------------------------------------------
    def _try(self, seq: SeqView, q: int) -> bool:
        """Schedule ``q`` tokens of ``seq`` if its KV growth fits; True if it did."""
        need = self.view.kv.blocks_needed(seq, seq.num_computed + q)
        if need > self.free:
            return False
        self.free -= need
        self.budget -= q
        self.num_tokens[seq.rid] = q
        return True

    def _preempt(self, seq: SeqView) -> None:
        self.preempted.append(seq.rid)
        self.free += held_blocks(self.view.kv, seq)
        self.slots += 1

    def _unscheduled(self) -> list[SeqView]:
        gone = set(self.preempted)
        return [s for s in self.live if s.rid not in gone and s.rid not in self.num_tokens]

    # -- moves --------------------------------------------------------------
    def schedule_decodes(self) -> None:
        """One token per running decode, preempting by recompute when KV runs out.

        vLLM v0 ``_schedule_running``: take running sequences oldest first;
        while one cannot grow, preempt the most recently admitted sequence not
        yet scheduled; if that victim is the sequence itself, stop there.
        """
        if self._cohort_decodes():
            return
        # decodes: a token generated and exactly one pending (not in_prefill)
        decodes = [s for s in self.live if s.num_generated and s.num_tokens - s.num_computed == 1]
        if self._all_decodes_fit(decodes):
            return
        co = self.cohort
        whole = co is not None and not self.num_tokens and len(decodes) == len(co)
        self._decode_or_preempt(decodes)
        if whole and self.num_tokens:
            # NOTE: when every member that was not preempted decodes, the plan still
            # decodes the cohort (the engine takes the preempted members out first)
            gone = set(self.preempted)
            if len(self.num_tokens) == sum(1 for s in decodes if s.rid not in gone):
                self._cohort_plan = True

    def _decode_or_preempt(self, decodes: list[SeqView]) -> None:
        for seq in decodes:
            if seq.rid in self.preempted:
                continue
            if self.budget < 1:
                break
            while not self._try(seq, 1):
                victim = self.victim(self._unscheduled())
                self._preempt(victim)
                if victim.rid == seq.rid:
                    return

    def _cohort_decodes(self) -> bool:
        """:meth:`_all_decodes_fit` over the view's decode cohort, when it holds every
        running decode and the plan has no rows yet (then it is the plan's first rows)."""
        co = self.cohort
        if co is None or self.num_tokens or self.preempted or self.budget < len(co) or any(
                s.num_generated and s.num_tokens - s.num_computed == 1 for s in self.others):
            return False
        need = co.growth(1)
        if need > self.free:
            return self._cohort_preempt(co)
        self._decode_all(co.rids, need)
        self._cohort_plan = bool(co.rids)
        return True

    def _cohort_preempt(self, co) -> bool:
        """:meth:`_decode_or_preempt` over the cohort, from its columns.

        The members are every running decode, in admission order; each needs
        one block this step or none, and holds exactly its tokens' blocks. As
        vLLM's loop does, take members oldest first; while one does not fit,
        preempt the most recently admitted running sequence not yet scheduled
        (the newer of the cohort's last member and the last other running
        sequence); stop when the victim is the member itself. Victims are
        always newer than the member being scheduled, so the scheduled members
        are a prefix of the cohort: a loop over integers, no ``Seq`` read.
        Returns False (the one-by-one rules then) for other victim rules or
        while the cohort has steps granted ahead.
        """
        if self.victim is not last_admitted or co.pending:
            return False
        bs = co.bs
        ctx = co.ctx
        need = (ctx % bs == 0).tolist()  # (ceil((c + 1) / bs) - ceil(c / bs): c >= 1)
        held = (-(-ctx // bs)).tolist()
        order, rids, others = co.ints[1].tolist(), co.rids, self.others
        kv = self.view.kv
        free, i, lim, jo = self.free, 0, len(need), len(others) - 1
        victims: list[tuple[int, int]] = []  # (admission order, rid)
        while i < lim:
            nd = need[i]
            while nd > free:
                if jo >= 0 and others[jo].order > order[lim - 1]:
                    v = others[jo]
                    jo -= 1
                    free += held_blocks(kv, v)
                    victims.append((v.order, v.rid))
                    continue
                lim -= 1
                free += held[lim]
                victims.append((order[lim], rids[lim]))
                if lim == i:  # the victim is the member itself
                    break
            else:
                free -= nd
                i += 1
        self.free = free
        self.budget -= i
        self.slots += len(victims)
        self.num_tokens = dict.fromkeys(rids[:i], 1)
        self.preempted = [rid for _, rid in victims]
        self._victims = tuple(rid for _, rid in sorted(victims))
        self._cohort_plan = i > 0
        return True

    def _all_decodes_fit(self, decodes: list[SeqView]) -> bool:
        """Fast path: schedule every decode at once when budget and KV cover all.

        Gives exactly the plan the one-by-one loop would (no sequence needs
        preempting then), in O(1) Python calls per step when the KV handle
        offers ``growth_needed``.
        NOTE: this is the simulator's hot path at high batch sizes.
        """
        if self.preempted or self.budget < len(decodes):
            return False
        kv = self.view.kv
        total = getattr(kv, "growth_needed", None)
        need = (total(decodes, 1) if total is not None
                else sum(kv.blocks_needed(s, s.num_computed + 1) for s in decodes))
        if need > self.free:
            return False
        self._decode_all([s.rid for s in decodes], need)
        return True

    def _decode_all(self, rids: list[int], need: int) -> None:
        """One token for each of ``rids``, whose KV growth takes ``need`` blocks."""
        self.free -= need
        self.budget -= len(rids)
        rows = dict.fromkeys(rids, 1)
        if self.num_tokens:
            self.num_tokens.update(rows)
        else:  # (the usual case: decodes are scheduled first)
            self.num_tokens = rows
        self._decodes = len(rids)

    def schedule_partial_prefills(self) -> bool:
        """Next chunk, ``min(pending, budget left)``, for each running prefill in admission order.

        Returns False when one could not be scheduled (budget spent or KV
        full): callers then admit nobody new, so a stalled prefill is not
        overtaken.
        """
        # (cohort members are plain decodes: the running sequences outside it suffice)
        for seq in self.others:
            if not seq.in_prefill or seq.rid in self.preempted:
                continue
            if self.budget < 1 or not self._try(seq, min(seq.pending, self.budget)):
                return False
        return True

    def admit(self, candidates: Sequence[SeqView], chunked: bool) -> None:
        """Admit waiting sequences in the given order until one does not fit.

        Whole prompts (``chunked=False``) need their whole ``pending`` within
        the budget left; a prompt larger than the whole budget can never run
        and is rejected. Chunked admissions take ``min(pending, budget left)``.
        Either way a sequence needs a free slot and blocks for
        ``num_computed + q`` tokens; the first that fails stops admission (FCFS).
        """
        for seq in candidates:
            if not chunked and seq.pending > self.cap:
                self.reject[seq.rid] = over_budget(seq.pending, self.cap)
                continue
            if self.slots < 1 or self.budget < 1:
                return
            q = min(seq.pending, self.budget) if chunked else seq.pending
            if q > self.budget or not self._try(seq, q):
                return
            self.slots -= 1

    def plan(self, steady: bool = False) -> BatchPlan:
        """The step as a value; victims listed in admission order.

        The engine puts preempted sequences at the front of the queue in plan
        order, so listing them oldest first restores their admission order
        (as vLLM does).

        ``steady=True`` is the caller's word that its admission rule can only
        get harder while the running decodes grow (the built-in policies':
        token budget and slots fixed, free KV blocks shrinking); the plan is
        then marked ``steady`` when it decodes every running sequence and
        does nothing else (see :class:`~sim.types.BatchPlan`).
        """
        preempt: tuple[int, ...] = ()
        if self._victims is not None:  # (_cohort_preempt sorted them by admission order)
            preempt = self._victims
        elif self.preempted:
            rank = {s.rid: i for i, s in enumerate(self.live)}
            preempt = tuple(sorted(self.preempted, key=rank.__getitem__))
        return BatchPlan(
            num_tokens=self.num_tokens,
            preempt=preempt,
            release=tuple(self.release),
            reject=self.reject,
            steady=(steady and 0 < self._decodes == len(self.num_tokens) == self.n_live
                    and not self.preempted and not self.release and not self.reject),
            decode_cohort=self._cohort_plan,
        )
