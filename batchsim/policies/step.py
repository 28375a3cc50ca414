"""The interpreter of iteration-level recipes: one step under a token budget and the KV cache.

Continuous batching and chunked prefill differ only in how they fill a step
(vLLM's insight: there is no prefill phase, only computed tokens catching up
with known tokens). :func:`run_iteration` builds one step from a policy's
:class:`~batchsim.policies.recipe.IterationRecipe`: a :class:`StepBuilder` holds what
every move needs — the token budget left, free KV blocks after this plan's
own frees and allocations, free sequence slots — and the recipe's moves run
in order, each skipped when one of its ``unless`` conditions holds:

- :meth:`StepBuilder.schedule_decodes`: every running decode gets one token;
  when the cache cannot hold the growth, preempt the recipe's victim (vLLM:
  the most recently admitted running sequence), exactly vLLM v0's
  ``_schedule_running``.
- :meth:`StepBuilder.schedule_partial_prefills`: running sequences whose
  prompt is only partly computed get the next chunk (Sarathi-Serve).
- :meth:`StepBuilder.admit`: waiting sequences enter in queue order, whole
  prompt or first chunk, stopping at the first that does not fit.

KV is accounted cumulatively, so the engine can always grant the plan. The
compiled core (batchsim/core/_core.c) interprets the same recipes with the same moves;
``batchsim.core`` runs a scenario there only while this module is the one the
core was written for (``batchsim.core.rules``).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Callable, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from batchsim.policies.base import PolicyConfig, held_blocks
from batchsim.policies.ordering import QUEUE_ORDERS, RETRACT_FIRST, VICTIM_RULES, QueueOrder, VictimRule, last_admitted
from batchsim.policies.recipe import (Admission, CudaGraphs, IterationRecipe, Move, check_capture_sizes,
                                     check_graphs_budget, check_max_context, check_max_padding)
from batchsim.sim.protocols import ReplicaView, SeqView
from batchsim.sim.types import BatchPlan

__all__ = ["IterationConfig", "CudaGraphsConfig", "StepBuilder", "REMAINING_CLIP", "graph_tokens", "over_budget",
           "over_watermark", "run_iteration"]

# Admission 'remaining': the most output tokens counted for one request (SGLang
# CLIP_MAX_NEW_TOKENS, env SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, default 4096:
# sglang/srt/managers/schedule_policy.py:89-91, environ.py:650).
REMAINING_CLIP = 4096


def over_budget(pending: int, cap: int) -> str:
    """Why a whole prompt is rejected (the compiled core's records give the same words: batchsim.core)."""
    return f"needs {pending} tokens in one step but max_num_batched_tokens is {cap}"


def over_watermark(tokens: int, blocks: int, total: int, watermark: int) -> str:
    """Why a sequence is rejected at admission: it can never leave the watermark free (vLLM V0 NEVER)."""
    return (f"{tokens} tokens need {blocks} KV blocks but only {total - watermark} of the {total} may be "
            f"allocated at admission (the watermark keeps {watermark} free)")


def graph_tokens(graphs: CudaGraphs, tokens: int, decode_only: bool, longest: int) -> int:
    """The tokens a step of ``tokens`` runs its dense operators at under ``graphs``: the smallest
    capture size of its kind (``decode_sizes`` when every row is a decode, else ``step_sizes``) at
    least ``tokens`` (vLLM V1 ``CudagraphDispatcher.dispatch``; SGLang ``_pad_to_bucket``), or
    ``tokens`` itself where the engine runs the step eagerly: above the largest size, a padding past
    ``step_max_padding`` (SGLang's prefill graphs), a row's context (``longest``, after the step)
    past ``decode_max_context`` (vLLM V0)."""
    sizes = graphs.decode_sizes if decode_only else graphs.step_sizes
    if not sizes or tokens > sizes[-1]:
        return tokens
    if decode_only and graphs.decode_max_context and longest > graphs.decode_max_context:
        return tokens
    padded = sizes[bisect_left(sizes, tokens)]
    if not decode_only and graphs.step_max_padding and padded > graphs.step_max_padding * tokens:
        return tokens
    return padded


class CudaGraphsConfig(BaseModel):
    """The engine's CUDA-graph capture sizes, in tokens (``cuda_graphs`` of the policy section); the checks
    are batchsim.policies.recipe's, which the recipe's CudaGraphs runs too."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    decode_sizes: tuple[int, ...] = Field(
        (), description="Capture sizes of steps whose every row is a decode, increasing, at most "
                        "max_num_batched_tokens.")
    step_sizes: tuple[int, ...] = Field(
        (), description="Capture sizes of every other step (prefills, mixed steps), increasing, at most "
                        "max_num_batched_tokens; empty: eager.")
    step_max_padding: float = Field(
        0.0, description="Run a non-decode step eagerly when its capture size exceeds this multiple of "
                         "its tokens (SGLang's prefill graphs: 2); 0: no limit.")
    decode_max_context: int = Field(
        0, description="Run a decode step eagerly when a row's context exceeds this (vLLM V0 "
                       "max_seq_len_to_capture); 0: no limit.")

    @field_validator("decode_sizes", "step_sizes", mode="before")
    @classmethod
    def _sizes(cls, v):
        return check_capture_sizes(v)

    @field_validator("step_max_padding", mode="before")
    @classmethod
    def _factor(cls, v):
        return check_max_padding(v)

    @field_validator("decode_max_context", mode="before")
    @classmethod
    def _context(cls, v):
        return check_max_context(v)

    def value(self) -> CudaGraphs:
        return CudaGraphs(decode_sizes=self.decode_sizes, step_sizes=self.step_sizes,
                          step_max_padding=float(self.step_max_padding), decode_max_context=self.decode_max_context)


class IterationConfig(PolicyConfig):
    """Limits shared by the iteration-level policies (vLLM ``SchedulerConfig`` names)."""

    max_num_seqs: int = Field(256, ge=1, description="Most sequences running at once (vLLM --max-num-seqs).")
    max_num_batched_tokens: int = Field(
        8192, ge=1, description="Most tokens computed in one step (vLLM --max-num-batched-tokens).")
    order: QueueOrder = Field(
        "fcfs", description="Order in which waiting sequences are tried for admission; preempted ones stay first.")
    admission: Admission = Field(
        "step", description="KV an admission must find free: 'step' this step's tokens (preempt later if "
                            "needed; vLLM v0), 'sequence' the whole prompt so far (vLLM v1 "
                            "scheduler_reserve_full_isl), 'completion' prompt + max_tokens, reserved at once "
                            "and never preempted (TensorRT-LLM GUARANTEED_NO_EVICT), 'remaining' the known "
                            "tokens plus remaining output after every running sequence's remaining output, "
                            "counted but not allocated (SGLang PrefillAdder).")
    watermark: float = Field(
        0.0, ge=0, lt=1, description="Fraction of the replica's KV blocks an admission must leave free; a "
                                     "sequence that can never leave them free is rejected (vLLM V0 "
                                     "BlockSpaceManager watermark, 0.01 there).")
    victim: VictimRule = Field(
        "last_admitted", description="Which running sequence is preempted when one cannot grow: "
                                     "'last_admitted' (vLLM), 'fewest_decoded' (fewest generated tokens, "
                                     "longest prompt on ties; SGLang retraction_policy='length').")
    schedule_ahead: bool = Field(
        False, description="Plan each step while the one before it runs (vLLM async scheduling, SGLang and "
                           "TensorRT-LLM overlap schedulers): a request arriving during a step joins the "
                           "step after next, and KV freed by a step is seen one plan later.")
    cuda_graphs: CudaGraphsConfig | None = Field(
        None, description="The engine's CUDA-graph capture sizes: a step's dense operators run padded to the "
                          "smallest size at least its tokens (vLLM, SGLang); none: every step at its own "
                          "token count.")
    enable_prefix_caching: bool = Field(
        False, description="Share and reuse KV of identical prompt prefixes, LRU-evicted (vLLM "
                           "--enable-prefix-caching); needs prefix hashes in the workload.")

    def recipe(self, moves: tuple[Move, ...]) -> IterationRecipe:
        """The recipe of these limits and rules with the policy's ``moves``."""
        return IterationRecipe(moves=moves, max_num_seqs=self.max_num_seqs,
                               max_num_batched_tokens=self.max_num_batched_tokens, order=self.order,
                               admission=self.admission, victim=self.victim, watermark=self.watermark,
                               schedule_ahead=self.schedule_ahead,
                               cuda_graphs=self.cuda_graphs.value() if self.cuda_graphs is not None else None)

    @field_validator("cuda_graphs")
    @classmethod
    def _graphs_within_budget(cls, v: CudaGraphsConfig | None, info: ValidationInfo) -> CudaGraphsConfig | None:
        cap = info.data.get("max_num_batched_tokens")
        if v is not None and cap is not None:
            check_graphs_budget(v.decode_sizes, v.step_sizes, cap)
        return v

    @field_validator("max_num_batched_tokens")
    @classmethod
    def _budget_covers_decodes(cls, v: int, info: ValidationInfo) -> int:
        # Every running sequence must be able to decode in one step (vLLM's check).
        seqs = info.data.get("max_num_seqs")
        if seqs is not None and v < seqs:
            raise ValueError(f"max_num_batched_tokens ({v}) must be >= max_num_seqs ({seqs}) "
                             "so every running sequence can decode in each step")
        return v


def run_iteration(recipe: IterationRecipe, view: ReplicaView) -> BatchPlan:
    """One step of an iteration-level policy: the recipe's moves, in order, under its guards."""
    step = StepBuilder(view, recipe.max_num_batched_tokens, recipe.max_num_seqs, VICTIM_RULES[recipe.victim],
                       recipe.admission, recipe.watermark, recipe.victim in RETRACT_FIRST)
    stalled = False
    for move in recipe.moves:
        skip = move.unless
        if (("rows" in skip and step.num_tokens) or ("preempted" in skip and step.preempted)
                or ("stalled" in skip and stalled)):
            continue
        kind = move.kind
        if kind == "decodes":
            step.schedule_decodes()
        elif kind == "partial_prefills":
            if not step.schedule_partial_prefills():
                stalled = True
        else:
            step.admit(QUEUE_ORDERS[recipe.order](view.waiting), chunked=kind == "admit_chunks")
    return step.plan(recipe.schedule_ahead, recipe.cuda_graphs)


def _is_decode(seq: SeqView) -> bool:
    """A running sequence's next step is a decode: it has generated a token and has exactly one pending."""
    return bool(seq.num_generated) and seq.num_tokens - seq.num_computed == 1


class StepBuilder:
    """Accumulates one step's plan while tracking budget, KV blocks and slots."""

    def __init__(self, view: ReplicaView, max_num_batched_tokens: int, max_num_seqs: int,
                 victim: Callable[[Sequence[SeqView]], SeqView] = last_admitted,
                 admission: Admission = "step", watermark: float = 0.0, retract_first: bool = False) -> None:
        self.view = view
        self.retract_first = retract_first  # victims from the whole decode batch before scheduling (SGLang)
        self.admission = admission
        self.watermark = int(watermark * view.kv.total_blocks)  # blocks an admission leaves free
        self.cap = max_num_batched_tokens
        self.budget = max_num_batched_tokens
        self.free = view.kv.free_blocks
        self.victim = victim
        self.num_tokens: dict[int, int] = {}
        self.longest = 0  # the longest scheduled row's context after the step
        self.not_decodes = 0  # scheduled rows that are not decodes (a prompt's tokens)
        self.preempted: list[int] = []
        self.release: list[int] = []
        self.reject: dict[int, str] = {}
        self.reserve: dict[int, int] = {}  # (admission 'completion': tokens each admission holds from now)
        for seq in view.running:
            if seq.finished:
                # NOTE: iteration-level policies never hold finished sequences;
                # should one be left running, let it go rather than leak its KV.
                self.release.append(seq.rid)
                self.free += held_blocks(view.kv, seq)
        # running, not finished, in admission order
        self.live = [s for s in view.running if not s.finished]
        self.slots = max_num_seqs - len(self.live)

    # -- primitives -------------------------------------------------------
    def _try(self, seq: SeqView, q: int, hold: int = 0, keep: int = 0) -> bool:
        """Schedule ``q`` tokens of ``seq`` if its KV growth (to ``hold`` tokens, if more) fits with ``keep``
        blocks left free; True if it did."""
        total = seq.num_computed + q
        need = self.view.kv.blocks_needed(seq, hold if hold > total else total)
        if need + keep > self.free:
            return False
        self.free -= need
        self.budget -= q
        self.num_tokens[seq.rid] = q
        if total > self.longest:
            self.longest = total
        if q != 1 or not _is_decode(seq):
            self.not_decodes += 1
        return True

    def _preempt(self, seq: SeqView) -> None:
        self.preempted.append(seq.rid)
        self.free += held_blocks(self.view.kv, seq)
        self.slots += 1

    def _whole(self, seq: SeqView) -> int:
        """The tokens the admission rule asks the KV to hold for ``seq``: its known tokens, plus its
        output (``completion``) or its remaining output clipped (``remaining``)."""
        if self.admission == "completion":
            return seq.prompt_tokens + seq.max_tokens
        if self.admission == "remaining":
            return seq.num_tokens + min(seq.max_tokens - seq.num_generated, REMAINING_CLIP)
        return seq.num_tokens

    def _future(self, seq: SeqView) -> int:
        """Admission 'remaining': the blocks ``seq`` will still need for its remaining output (clipped)
        beyond what this plan gives it, once its prompt is in (0 while this step leaves it mid-prompt)."""
        kv, now = self.view.kv, seq.num_computed + self.num_tokens.get(seq.rid, 0)
        if seq.in_prefill and now < seq.num_tokens:  # (a recompute's prompt too)
            return 0
        left = min(seq.max_tokens - seq.num_generated, REMAINING_CLIP)
        return kv.blocks_needed(seq, seq.num_tokens + left) - kv.blocks_needed(seq, now)

    def _unscheduled(self) -> list[SeqView]:
        gone = set(self.preempted)
        return [s for s in self.live if s.rid not in gone and s.rid not in self.num_tokens]

    # -- moves --------------------------------------------------------------
    def schedule_decodes(self) -> None:
        """One token per running decode, preempting by recompute when KV runs out.

        vLLM v0 ``_schedule_running``: take running decodes oldest first;
        while one cannot grow, preempt the victim (by default the most
        recently admitted sequence not yet scheduled); if that victim is the
        sequence itself, stop there. With ``retract_first`` (SGLang
        ``retract_decode``), first, while the decodes cannot all grow and more
        than one is left, preempt the victim among all of them.
        """
        # decodes: a token generated and exactly one pending (not in_prefill)
        decodes = [s for s in self.live if _is_decode(s)]
        if self.retract_first:  # (nothing is preempted yet: this is the only move that preempts)
            kv = self.view.kv
            need = sum(kv.blocks_needed(s, s.num_computed + 1) for s in decodes)
            while len(decodes) > 1 and need > self.free:
                victim = self.victim(decodes)
                need -= kv.blocks_needed(victim, victim.num_computed + 1)
                self._preempt(victim)
                decodes.remove(victim)
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

    def schedule_partial_prefills(self) -> bool:
        """Next chunk, ``min(pending, budget left)``, for each running prefill in admission order.

        Returns False when one could not be scheduled (budget spent or KV
        full): the recipe's ``stalled`` guard then keeps admissions out, so a
        stalled prefill is not overtaken.
        """
        for seq in self.live:
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
        The recipe's ``admission`` rule asks for more: the whole known sequence
        (``sequence``: checked, only this step's tokens allocated), or prompt
        plus ``max_tokens`` (``completion``: allocated now, and held), or the whole known
        sequence plus its remaining output once every running sequence's remaining output
        is counted (``remaining``: counted, not allocated). Each leaves the
        watermark's blocks free; a sequence whose known tokens need more than all
        blocks less the watermark is rejected.
        """
        rule, kv, keep = self.admission, self.view.kv, self.watermark
        promised = 0  # admission 'remaining': blocks counted for running sequences' remaining output
        if rule == "remaining":
            gone = set(self.preempted)
            promised = sum(self._future(s) for s in self.live if s.rid not in gone)
        for seq in candidates:
            if not chunked and seq.pending > self.cap:
                self.reject[seq.rid] = over_budget(seq.pending, self.cap)
                continue
            tokens = self._whole(seq)  # (what the rule asks the KV to hold)
            spare = keep if keep and not kv.blocks_held(seq) else 0  # (KV that arrived by transfer: not allocated here)
            if spare:
                whole = kv.blocks_needed(seq, tokens)
                if whole > kv.total_blocks - spare:
                    self.reject[seq.rid] = over_watermark(tokens, whole, kv.total_blocks, spare)
                    continue
            if self.slots < 1 or self.budget < 1:
                return
            q = min(seq.pending, self.budget) if chunked else seq.pending
            if q > self.budget:
                return
            # 'sequence' and 'remaining' check what the rule holds (after the running sequences'
            # remaining output, with 'remaining'); 'completion' allocates it; 'step' this step's tokens
            if rule in ("sequence", "remaining") and kv.blocks_needed(seq, tokens) + promised + spare > self.free:
                return
            hold = tokens if rule == "completion" else 0
            if not self._try(seq, q, hold, spare):
                return
            if rule == "remaining":
                promised += self._future(seq)
            elif hold:
                self.reserve[seq.rid] = hold
            self.slots -= 1

    def plan(self, ahead: bool = False, graphs: CudaGraphs | None = None) -> BatchPlan:
        """The step as a value (planned ahead or not, run padded to ``graphs``' sizes or not); victims
        listed in admission order.

        The engine puts preempted sequences at the front of the queue in plan
        order, so listing them oldest first restores their admission order
        (as vLLM does).
        """
        preempt: tuple[int, ...] = ()
        if self.preempted:
            rank = {s.rid: i for i, s in enumerate(self.live)}
            preempt = tuple(sorted(self.preempted, key=rank.__getitem__))
        padded = 0
        if graphs is not None and self.num_tokens:
            tokens = self.cap - self.budget  # (the tokens scheduled)
            padded = graph_tokens(graphs, tokens, not self.not_decodes, self.longest)
            if padded == tokens:
                padded = 0
        return BatchPlan(num_tokens=self.num_tokens, preempt=preempt, release=tuple(self.release),
                         reject=self.reject, reserve=self.reserve, ahead=ahead, graph_tokens=padded)
