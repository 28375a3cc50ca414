"""Static-shape decode steps and their CUDA graphs: the reference executor's graph path.

A serving engine replays a pure-decode step from a CUDA graph captured for its
padded batch size, so the step costs the device's time. The reference executor
ran every step eagerly, and on the H200 of docs/validation.md an eager llama-3-8b
decode step spent ~11 ms of host time launching ~4 ms of kernels. With
:class:`DecodeGraphs`, :class:`batchsim.calibrate.executor.ReferenceModel` runs a
pure-decode step (every row one new token over a cached context) on a layout
whose every shape depends only on a key (P, K):

- the batch of B rows is padded to the next capture size P (:data:`CAPTURE_SIZES`,
  vLLM's defaults); the P - B padding rows are scratch rows on one held pad slot,
  attending to its position 0 and writing their KV there (thrown away), as
  :func:`batchsim.calibrate.executor.phantom_rows` steps' KV is;
- every input (token ids, positions, KV slots, context lengths, sample indices)
  is written into preallocated static tensors, with one host-to-device copy;
- decode attention gathers each row's KV up to a bucket K of the longest context
  (:func:`kv_bucket`) and masks by the lengths.

The model's forward (shared with eager steps; only the input layout differs) runs
on that layout eagerly on a CPU (mode ``static``: its logic, tested on the CPU)
and on CUDA is captured once per key and replayed (``capture`` for the step that
captured, ``graph`` for replays). KV writes are part of the graph, into the
persistent KV slabs, so a slab reallocation drops every graph
(:meth:`DecodeGraphs.inputs_for` compares the model's ``epoch``).

Sources: capture sizes from vLLM's ``VllmConfig._set_cudagraph_sizes``; the
capture recipe (warm-up on a side stream, ``torch.cuda.graph``, static inputs
refilled before ``replay``, a pool shared across captures) from torch's CUDA
graph documentation (``torch.cuda.graph``, "CUDA Graphs" in the CUDA semantics
notes) and vLLM's model runner, which captures every size into one global pool.
"""

from __future__ import annotations

import bisect
import time
from typing import Callable, Sequence

import torch

from batchsim.calibrate.kernels import bucket
from batchsim.engines import vllm_v1_capture_sizes

__all__ = ["CAPTURE_SIZES", "KV_MIN", "KV_PER_OCTAVE", "MODES", "capture_size", "kv_bucket", "kv_buckets",
           "decode_key", "scratch_ids", "DecodeGraphs", "summary", "describe"]

# vLLM's default CUDA-graph capture sizes: [1, 2, 4], multiples of 8 below 256, then multiples
# of 16 up to max_cudagraph_capture_size = min(2 * max_num_seqs, 512) (1024 on data-centre
# Blackwell). Source: vllm-project/vllm, vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes
# (docstring and body; read at commit 000fc94b). The executor has no max_num_seqs, so the list
# runs to 512 (vLLM's ceiling for max_num_seqs >= 256: the vllm-v1 preset's rule,
# batchsim.engines.vllm_v1_capture_sizes, at 256 sequences); a larger decode batch runs eager, as
# vLLM runs a batch above its largest capture size.
CAPTURE_SIZES: tuple[int, ...] = tuple(vllm_v1_capture_sizes(256, 8192))

# NOTE: the KV bucket grid is 8 sizes per doubling of the longest context (kernels.bucket), at
# least 16. vLLM needs no such key (its paged attention takes lengths as device data); this
# executor's stand-in gathers each row's KV into a dense tensor for SDPA, whose length is a
# shape. The bucket over-reads at most 1/8 of the longest context (about 1/16 on average) on
# top of what the padded gather already reads (every row up to the longest). For llama-3-8b
# at 16 rows and 384 tokens the gather and SDPA move ~2.4 GB, ~14% of a ~4.5 ms step on an
# H200, so the bucket adds <= 1.7% (about 0.9% on average) to such a step; less at smaller
# batches and contexts. 16 sizes per doubling would halve that and double the graphs: a
# validation run (decode batches <= 16, contexts <= 392) meets 38 buckets x 5 sizes = 190
# keys on this grid, captured at warm-up in ~7 s on the H200 (two eager steps' host time each).
KV_MIN = 16
KV_PER_OCTAVE = 8
MODES = ("eager", "static", "capture", "graph")  # how a step ran (StepRecord.mode)


def capture_size(rows: int) -> int | None:
    """The smallest capture size holding ``rows`` rows (None above the largest: that step runs eager)."""
    i = bisect.bisect_left(CAPTURE_SIZES, max(rows, 1))
    return CAPTURE_SIZES[i] if i < len(CAPTURE_SIZES) else None


def kv_bucket(need: int, cap: int) -> int:
    """The KV length decode attention gathers for a longest context of ``need`` tokens (<= ``cap``)."""
    return min(cap, max(KV_MIN, bucket(need, KV_PER_OCTAVE)))


def kv_buckets(cap: int) -> list[int]:
    """Every KV bucket a slab of ``cap`` positions can need, ascending."""
    return sorted({kv_bucket(n, cap) for n in range(1, cap + 1)})


def decode_key(rows: Sequence, cap: int) -> tuple[int, int] | None:
    """``(P, K)`` for a pure-decode step that fits the static path, else None (run it eager).

    Pure decode: every row one new token over a cached context (``q == 1``, ``kv > 0``).
    """
    if not rows or any(r.q != 1 or r.kv <= 0 for r in rows):
        return None
    padded = capture_size(len(rows))
    need = max(r.kv for r in rows) + 1
    if padded is None or need > cap:  # (past the slab: the eager path raises the InputError)
        return None
    return padded, kv_bucket(need, cap)


def scratch_ids(first: int, count: int, slot: int, vocab: int) -> list[int]:
    """Token ids of a scratch row's positions ``first..first+count-1`` on ``slot``.

    NOTE: spread over the vocabulary, not all id 0: identical rows flatter a GPU's GEMMs
    (less switching power: 894 against 788 TFLOP/s on an H200).
    """
    return [(p * 104729 + slot * 7919 + 1) % vocab for p in range(first, first + count)]


class DecodeGraphs:
    """Static inputs and captured graphs of a model's pure-decode steps.

    ``capture``: capture and replay CUDA graphs (CUDA only); otherwise the static
    layout runs eagerly. ``captured`` counts captures, ``seconds`` their host time;
    ``error`` holds a failed capture's message (capture is then off, and the steps
    run the static layout eagerly, recorded as ``static``).
    """

    def __init__(self, device: torch.device, capture: bool) -> None:
        if capture and device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.device, self.capture = device, capture
        top = CAPTURE_SIZES[-1]
        # NOTE: a P-row step's token ids, positions, KV slots and context lengths lie packed in
        # the first 4P entries of one buffer (pinned on CUDA), copied in one transfer, not one
        # per input; each key's views sit at offsets of its own P, so its graph's pointers hold
        self.host = torch.zeros(4 * top, dtype=torch.long, pin_memory=capture)
        self.inputs = torch.zeros(4 * top, dtype=torch.long, device=device)
        self.index = torch.arange(top, device=device)  # the sample indices: every row's logits
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.pool = None
        self.stream = None
        self.epoch = -1
        self.captured = 0
        self.seconds = 0.0
        self.error: str | None = None

    def drop(self) -> None:
        """Forget every graph (their KV and RoPE pointers are stale) and start a fresh pool."""
        self.graphs.clear()
        self.pool = None

    def inputs_for(self, model, rows: Sequence, key: tuple[int, int]) -> dict:
        """Write a pure-decode step's inputs into the static tensors; the forward's input dict.

        ``model`` gives the KV slots (:meth:`ReferenceModel.slot`, ``pad_slot``) and
        the vocabulary; scratch rows (key None) take a slot for this step only
        (returned in ``scratch``, freed by the caller), as eager steps' do.
        """
        padded, kv = key
        b = len(rows)
        slots = [model.slot(r.key) for r in rows]
        scratch = [s for r, s in zip(rows, slots) if r.key is None]
        pad = model.pad_slot() if padded > b else 0
        if self.epoch != model.epoch:  # (slots above may have grown the slabs)
            self.drop()
            self.epoch = model.epoch
        vocab = model.spec.vocab_size
        host = self.host[:4 * padded].numpy().reshape(4, padded)
        host[0, :b] = [r.ids[0] if r.ids is not None else scratch_ids(r.kv, 1, s, vocab)[0]
                       for r, s in zip(rows, slots)]
        host[1, :b] = [r.kv for r in rows]
        host[2, :b] = slots
        host[3, :b] = [r.kv + 1 for r in rows]
        if padded > b:  # padding rows: position 0 of the pad slot, which they write and read
            host[0, b:padded] = scratch_ids(0, padded - b, pad, vocab)
            host[1:4, b:padded] = [[0], [pad], [1]]
        self.inputs[:4 * padded].copy_(self.host[:4 * padded], non_blocking=self.capture)
        ids, pos, slot, lens = self.inputs[:4 * padded].view(4, padded)
        return {"n": padded, "ids": ids, "pos": pos, "tok_slot": slot, "tok_pos": pos,
                "samples": self.index[:padded],
                "picks": [(i, i) for i, r in enumerate(rows) if r.sample_at is not None],
                "dec": padded, "dec_slots": slot, "dec_lens": lens, "dec_max": kv, "pre": [], "scratch": scratch}

    def run(self, key: tuple[int, int], forward: Callable[[], tuple]) -> tuple[tuple, str]:
        """Run ``forward`` (the model's forward over the static inputs): eagerly, or by
        replaying the key's graph, captured first if new. Returns its outputs and the mode."""
        if not self.capture:
            return forward(), "static"
        hit = self.graphs.get(key)
        if hit is not None:
            hit[0].replay()
            return hit[1], "graph"
        try:
            graph, out = self._capture(forward)
        except RuntimeError as e:
            # NOTE: recorded, not raised: the run goes on with the static layout eagerly (mode
            # "static", the error in validate.json and facts.json), so one device session still
            # yields evidence; the gpu tests fail on it outright
            first = (str(e).strip().splitlines() or [""])[0]
            self.capture, self.error = False, f"{type(e).__name__}: {first[:300]}"
            torch.cuda.synchronize(self.device)
            return forward(), "static"
        self.graphs[key] = (graph, out)
        graph.replay()  # (capture records the work without running it)
        return out, "capture"

    def _capture(self, forward: Callable[[], tuple]) -> tuple:
        """One warm-up run on a side stream, then the capture into the shared pool.

        NOTE: torch's documented recipe: warm up on a side stream (lazy initialisation,
        workspaces and kernel choices happen outside the capture), then capture; vLLM does
        one warm-up per size (cudagraph_num_of_warmups = 1). Every graph shares one memory
        pool and the one capture stream, as vLLM's graphs share its global pool: a graph's
        intermediates are dead once its step is read back, and steps never overlap, so the
        next graph may reuse them; each graph's outputs stay its own (held here).
        """
        t0 = time.perf_counter()
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            forward()
        current.wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = forward()
        self.captured += 1
        self.seconds += time.perf_counter() - t0
        return graph, out


def summary(model, modes: Sequence[str]) -> dict:
    """How a model ran its steps, for facts.json, profile provenance and validate.json:
    ``graphs`` (pure decodes on the static layout), ``capture`` (as CUDA graphs; on a CPU
    the layout runs eagerly), graphs ``captured`` so far and their host seconds
    (``capture_s``), and the count of ``modes`` (one per step) by mode."""
    g = model.decode_graphs
    out = {"graphs": model.graphs, "capture": bool(g is not None and g.capture),
           "captured": g.captured if g is not None else 0,
           "capture_s": round(g.seconds, 3) if g is not None else 0.0,
           "steps": {m: list(modes).count(m) for m in sorted(set(modes))}}
    if g is not None and g.error:
        out["capture_error"] = g.error
    return out


def describe(facts: dict | None) -> str:
    """The executor's step path in words, from :func:`summary`'s dict (None: before graphs existed)."""
    if facts and facts.get("graphs") and facts.get("capture"):
        return "pure-decode steps replayed from CUDA graphs, other steps eager PyTorch"
    if facts and facts.get("graphs"):
        return "eager PyTorch, pure-decode steps on the CUDA-graph path's static layout (not captured)"
    return "eager PyTorch"
