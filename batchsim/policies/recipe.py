"""The vocabulary of the built-in policies' rules: small frozen recipes.

A built-in policy states its rules once, as a value: an
:class:`IterationRecipe` (continuous batching, chunked prefill) or a
:class:`PaddedRecipe` (static and dynamic batching). Two interpreters run a
recipe: :func:`batchsim.policies.step.run_iteration` / :func:`batchsim.policies.padded.run_padded`
in Python (the SimPy engine's reference), and the compiled core
(``batchsim/core/_core.c``) in C. A policy that changes its recipe (another order of
moves, another guard, another queue order) changes both engines' results
alike; one that overrides ``schedule`` runs on the SimPy engine only
(``batchsim.core.unsupported`` says why, and the run's summary records it).

An iteration-level step is built by *moves*, tried in order, each skipped
when one of its ``unless`` conditions holds:

=====================  ==========================================================
move                   what it schedules (batchsim/policies/step.py, StepBuilder)
=====================  ==========================================================
``decodes``            one token per running decode; preempt by recompute (the
                       recipe's ``victim``) while the KV cache cannot hold one
``partial_prefills``   the next chunk, ``min(pending, budget left)``, of every
                       running prompt that is partly computed, in admission order
``admit``              waiting prompts whole, in ``order``, until one does not fit
                       (a prompt over the whole token budget is rejected)
``admit_chunks``       waiting prompts' first chunks, ``min(pending, budget left)``
=====================  ==========================================================

How much KV an admission must find free is the recipe's ``admission`` rule:

=====================  ==========================================================
``admission``          a waiting sequence is admitted when the free blocks hold
=====================  ==========================================================
``step``               this step's tokens (``num_computed + q``); running
                       sequences that later cannot grow are preempted (vLLM v0,
                       Sarathi)
``sequence``           its whole known sequence (prompt and any generated
                       tokens), though only this step's tokens are allocated
                       (vLLM v1 ``scheduler_reserve_full_isl``)
``completion``         prompt plus ``max_tokens``, all reserved at admission, so
                       a running sequence never needs a block it does not hold
                       and is never preempted (TensorRT-LLM
                       ``GUARANTEED_NO_EVICT``)
``remaining``          its known tokens plus its remaining output, after the
                       remaining output of every running sequence that has
                       finished (or this step finishes) its prompt, each
                       output clipped at ``REMAINING_CLIP`` tokens; only this
                       step's tokens are allocated, so running sequences grow
                       into what was counted for them (SGLang ``PrefillAdder``
                       for requests that run to ``max_new_tokens``)
=====================  ==========================================================

Whatever the rule, an admission leaves ``watermark`` of the replica's KV blocks
(``int(watermark x total blocks)``) free, and a waiting sequence for which the rule
asks more than the blocks less the watermark is rejected (vLLM V0
``BlockSpaceManager.can_allocate``: ``LATER`` and ``NEVER``). Running sequences'
growth ignores it, as in vLLM V0, and so does the admission of a sequence that
already holds KV (a transfer's, on a disaggregated decode pool).

=====================  ==========================================================
``victim``             the running sequence preempted when one cannot grow
=====================  ==========================================================
``last_admitted``      the most recently admitted (vLLM)
``fewest_decoded``     the fewest generated tokens, the longest prompt on ties,
                       then the most recently admitted, chosen first among all
                       the step's decodes while they cannot all grow (SGLang
                       ``retract_decode``, ``retraction_policy='length'``)
=====================  ==========================================================

With ``schedule_ahead`` the replica plans each step while the one before it
runs, as vLLM's async scheduling and SGLang's and TensorRT-LLM's overlap
schedulers do (the plans say ``ahead``; batchsim.sim.types.BatchPlan): a request
that reaches the replica during a step joins the step after next, and the KV a
step's finished sequences free is seen by the plan after next too.

With ``cuda_graphs`` (:class:`CudaGraphs`) the step's dense operators run padded to the
engine's CUDA-graph capture sizes, as vLLM's and SGLang's graph replays run them: a step of
``T`` tokens runs them at the smallest capture size ``>= T`` (a step whose every row is a
decode uses ``decode_sizes``, any other step ``step_sizes``), and at ``T`` itself above the
largest size or where the engine runs the step eagerly (the plan's ``graph_tokens``;
batchsim.policies.step.graph_tokens states the rule). Attention and the LM head run on the
real rows.

Each move appears at most once, and a recipe admits whole prompts or chunks,
not both: the moves then take disjoint sets of sequences.

=====================  ==========================================================
``unless``             the move is skipped when
=====================  ==========================================================
``rows``               the step already schedules some tokens
``preempted``          the step preempted a sequence (vLLM: victims would thrash)
``stalled``            a ``partial_prefills`` move could not schedule some prompt
                       (admitting now would overtake it)
=====================  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["Move", "CudaGraphs", "IterationRecipe", "PaddedRecipe", "Recipe", "MOVES", "GUARDS", "ORDERS", "VICTIMS", "ADMISSIONS"]

MoveKind = Literal["decodes", "partial_prefills", "admit", "admit_chunks"]
Guard = Literal["rows", "preempted", "stalled"]
Order = Literal["fcfs", "shortest_prompt_first"]
Victim = Literal["last_admitted", "fewest_decoded"]
Admission = Literal["step", "sequence", "completion", "remaining"]

MOVES: tuple[str, ...] = get_args(MoveKind)
GUARDS: tuple[str, ...] = get_args(Guard)
ORDERS: tuple[str, ...] = get_args(Order)
VICTIMS: tuple[str, ...] = get_args(Victim)
ADMISSIONS: tuple[str, ...] = get_args(Admission)


def _one_of(what: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {', '.join(allowed)}")


def _positive_int(what: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class Move:
    """One move of an iteration-level step and the conditions that skip it."""

    kind: MoveKind
    unless: tuple[Guard, ...] = ()

    def __post_init__(self) -> None:
        _one_of("move", self.kind, MOVES)
        if not isinstance(self.unless, tuple):
            raise ValueError(f"Move.unless must be a tuple, got {self.unless!r}")
        for g in self.unless:
            _one_of("guard", g, GUARDS)


# the most capture sizes one list may hold (the compiled core's fixed arrays)
MAX_GRAPH_SIZES = 2048
# the largest context decode_max_context may name (beyond any model's)
MAX_GRAPH_CONTEXT = 1 << 40


def check_capture_sizes(sizes) -> tuple[int, ...]:
    """``sizes`` as a tuple if it is a capture-size list: increasing integers >= 1, at most
    :data:`MAX_GRAPH_SIZES` of them; ValueError naming the bad value otherwise."""
    if not isinstance(sizes, (list, tuple)):
        raise ValueError(f"expected a list of capture sizes (integers >= 1), got {sizes!r}")
    if len(sizes) > MAX_GRAPH_SIZES:
        raise ValueError(f"at most {MAX_GRAPH_SIZES} capture sizes, got {len(sizes)}")
    for x in sizes:
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"capture sizes must be integers >= 1, got {x!r}")
    for a, b in zip(sizes, sizes[1:]):
        if not a < b:
            raise ValueError(f"sizes must increase strictly, got {a} then {b}")
    return tuple(sizes)


def check_max_padding(v) -> float:
    """``step_max_padding`` as a float if it is 0 (no limit) or a factor from 1 to 1e6."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v == 0 or 1 <= v <= 1e6):
        raise ValueError(f"step_max_padding must be 0 (no limit) or a factor from 1 to 1e6, got {v!r}")
    return float(v)


def check_max_context(v) -> int:
    """``decode_max_context`` if it is an integer from 0 (no limit) to :data:`MAX_GRAPH_CONTEXT`."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_GRAPH_CONTEXT:
        raise ValueError(f"decode_max_context must be an integer from 0 (no limit) to 2^40, got {v!r}")
    return v


def check_graphs_budget(decode_sizes: tuple[int, ...], step_sizes: tuple[int, ...], cap: int) -> None:
    """No capture size above the token budget ``cap``: a step never has more tokens, so no larger graph is
    replayed (vLLM keeps only capture sizes <= max_num_batched_tokens: config/vllm.py:2566-2571)."""
    for name, sizes in (("decode_sizes", decode_sizes), ("step_sizes", step_sizes)):
        if sizes and sizes[-1] > cap:
            raise ValueError(f"{name}: {sizes[-1]} is above max_num_batched_tokens ({cap}); a step never "
                             "has more tokens, so no larger graph is replayed (vLLM drops such sizes)")


@dataclass(frozen=True)
class CudaGraphs:
    """The token counts an engine captured CUDA graphs at, and when it replays them.

    ``decode_sizes`` serve steps whose every row is a decode, ``step_sizes`` every other step
    (either may be empty: such steps run eagerly, unpadded). ``step_max_padding`` (> 0) runs a
    step eagerly when its size would exceed that multiple of its tokens (SGLang's prefill
    graphs: 2); ``decode_max_context`` (> 0) runs a decode step eagerly when a row's
    context after the step exceeds it (vLLM V0's ``max_seq_len_to_capture``).
    """

    decode_sizes: tuple[int, ...] = ()
    step_sizes: tuple[int, ...] = ()
    step_max_padding: float = 0.0
    decode_max_context: int = 0

    def __post_init__(self) -> None:
        for name, check in (("decode_sizes", check_capture_sizes), ("step_sizes", check_capture_sizes),
                            ("step_max_padding", check_max_padding), ("decode_max_context", check_max_context)):
            value = getattr(self, name)
            if name.endswith("sizes") and not isinstance(value, tuple):
                raise ValueError(f"{name} must be a tuple, got {value!r}")
            try:
                check(value)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None


@dataclass(frozen=True)
class IterationRecipe:
    """An iteration-level policy's rules: its moves, limits, queue order, victim and admission rules."""

    moves: tuple[Move, ...]
    max_num_seqs: int
    max_num_batched_tokens: int
    order: Order = "fcfs"
    victim: Victim = "last_admitted"
    admission: Admission = "step"
    watermark: float = 0.0
    schedule_ahead: bool = False
    cuda_graphs: CudaGraphs | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.moves, tuple) or not all(isinstance(m, Move) for m in self.moves):
            raise ValueError(f"IterationRecipe.moves must be a tuple of Move, got {self.moves!r}")
        kinds = [m.kind for m in self.moves]
        # NOTE: each move takes sequences no earlier move can have taken: decodes (running plain
        # decodes), partial prefills (running prompts), admissions (waiting ones, whole or chunked).
        # A move twice, or both admissions, would schedule or reject a sequence twice.
        if len(set(kinds)) != len(kinds) or {"admit", "admit_chunks"} <= set(kinds):
            raise ValueError(f"IterationRecipe.moves {kinds}: each move at most once, and admit or "
                             "admit_chunks, not both")
        _positive_int("max_num_seqs", self.max_num_seqs)
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        _one_of("queue order", self.order, ORDERS)
        _one_of("victim rule", self.victim, VICTIMS)
        _one_of("admission rule", self.admission, ADMISSIONS)
        w = self.watermark
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < 1:
            raise ValueError(f"watermark must be a fraction >= 0 and < 1, got {w!r}")
        if not isinstance(self.schedule_ahead, bool):
            raise ValueError(f"schedule_ahead must be true or false, got {self.schedule_ahead!r}")
        if self.cuda_graphs is not None:
            if not isinstance(self.cuda_graphs, CudaGraphs):
                raise ValueError(f"cuda_graphs must be a CudaGraphs or None, got {self.cuda_graphs!r}")
            check_graphs_budget(self.cuda_graphs.decode_sizes, self.cuda_graphs.step_sizes,
                                self.max_num_batched_tokens)


@dataclass(frozen=True)
class PaddedRecipe:
    """A padded-batch policy's launch rule (the batch then runs as batchsim/policies/padded.py says).

    When the replica is idle and ``n`` requests wait: launch ``max_batch_size``
    if ``n`` reaches it; else the largest of ``preferred_batch_sizes`` that
    ``n`` can fill; else all ``n`` once the oldest has waited
    ``max_queue_delay_s`` (at once when it is 0); until then, wake at that
    deadline. Static batching is the case without preferred sizes.
    """

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_s: float = 0.0
    complete_at: Literal["batch_end", "own_token"] = "batch_end"

    def __post_init__(self) -> None:
        _positive_int("max_batch_size", self.max_batch_size)
        if not isinstance(self.preferred_batch_sizes, tuple):
            raise ValueError(f"preferred_batch_sizes must be a tuple, got {self.preferred_batch_sizes!r}")
        for b in self.preferred_batch_sizes:
            _positive_int("a preferred batch size", b)
        delay = self.max_queue_delay_s
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not delay >= 0:
            raise ValueError(f"max_queue_delay_s must be a number >= 0, got {delay!r}")
        _one_of("complete_at", self.complete_at, ("batch_end", "own_token"))


Recipe = IterationRecipe | PaddedRecipe
