"""Shortest-prompt-first (SPF) continuous batching, as an outside policy.

Written against batchsim's public policy interface only: the read-only
replica view (:mod:`batchsim.sim.protocols`), the plan value it returns
(:class:`batchsim.sim.types.BatchPlan`) and the config base class
(:class:`policies.PolicyConfig`). Each step:

1. every running sequence computes its pending tokens (one, for a decode),
   oldest first; when the KV cache cannot hold a sequence's growth, the most
   recently admitted running sequence is preempted by recompute (vLLM's rule),
   which frees what ``kv.blocks_held`` says it holds;
2. if nothing was preempted, waiting sequences enter — preempted ones first,
   then shortest prompt first — while a sequence slot, the step's token
   budget and KV blocks allow; decodes and whole prefills share the step
   (Orca's "mixed" iteration).

A prompt longer than the whole token budget can never run: it is rejected.
NOTE: SPF cuts mean time-to-first-token when prompt length predicts prefill
work, but a steady stream of short prompts starves long ones (no aging here).
"""

from __future__ import annotations

from typing import ClassVar, Sequence

from pydantic import Field, model_validator

from batchsim.policies import PolicyConfig
from batchsim.sim.protocols import ReplicaView, SeqView
from batchsim.sim.types import BatchPlan

__all__ = ["SPFConfig", "ShortestPromptFirst", "admission_order"]


class SPFConfig(PolicyConfig):
    """Knobs of :class:`ShortestPromptFirst` (vLLM engine-argument names)."""

    max_num_seqs: int = Field(64, ge=1, description="Most sequences running at once.")
    max_num_batched_tokens: int = Field(4096, ge=1, description="Most tokens computed in one step.")

    @model_validator(mode="after")
    def _budget_covers_decodes(self) -> "SPFConfig":
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({self.max_num_seqs}) so every running sequence can decode")
        return self


def admission_order(waiting: Sequence[SeqView]) -> list[SeqView]:
    """Preempted sequences first (they already hold output), then shortest prompt; ties keep queue order."""
    return sorted(waiting, key=lambda s: (s.num_preemptions == 0, s.prompt_tokens))


class ShortestPromptFirst:
    """Continuous batching that admits the shortest waiting prompts first."""

    name: ClassVar[str] = "spf"
    Config: ClassVar[type[PolicyConfig]] = SPFConfig

    def __init__(self, config: SPFConfig | None = None) -> None:
        self.config = config if config is not None else SPFConfig(name=self.name)

    def schedule(self, view: ReplicaView) -> BatchPlan:
        """Decodes first (preempting when KV runs out), then SPF admissions."""
        cfg, kv = self.config, view.kv
        free, budget = kv.free_blocks, cfg.max_num_batched_tokens
        num_tokens: dict[int, int] = {}
        victims: list[SeqView] = []
        queue = list(view.running)  # admission order, oldest first
        while queue:
            seq = queue.pop(0)
            q = seq.pending
            if q > budget:
                break
            need = kv.blocks_needed(seq, seq.num_computed + q)
            while need > free and queue:
                victim = queue.pop()  # the most recently admitted one not yet scheduled
                victims.append(victim)
                free += kv.blocks_held(victim)
            if need > free:
                victims.append(seq)
                free += kv.blocks_held(seq)
                break
            num_tokens[seq.rid], free, budget = q, free - need, budget - q
        cap = cfg.max_num_batched_tokens
        reject = {s.rid: f"needs {s.pending} tokens in one step but max_num_batched_tokens is {cap}"
                  for s in view.waiting if s.pending > cap}
        # NOTE: a step that had to preempt admits nobody: the victims would
        # come straight back and thrash (vLLM does the same).
        if not victims:
            slots = cfg.max_num_seqs - len(view.running)
            for seq in admission_order([s for s in view.waiting if s.rid not in reject]):
                need = kv.blocks_needed(seq, seq.num_computed + seq.pending)
                if slots < 1 or seq.pending > budget or need > free:
                    break
                num_tokens[seq.rid] = seq.pending
                free, budget, slots = free - need, budget - seq.pending, slots - 1
        # Victims were taken newest first; the engine requeues them in plan order.
        return BatchPlan(num_tokens=num_tokens, preempt=tuple(s.rid for s in reversed(victims)),
                         reject=reject)
