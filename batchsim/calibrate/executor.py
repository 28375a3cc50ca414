"""The reference executor: the simulator's policies driving a real transformer.

:class:`ReferenceModel` is a Llama-style decoder in torch (random weights,
sizes from a :class:`~batchsim.calibrate.models.ModelSpec`) built from the kernels of
:mod:`batchsim.calibrate.kernels`, with one KV-cache slot per sequence. It runs one
*step* at a time: rows of ``q`` new tokens over ``kv`` cached ones, packed
into one token batch for the GEMMs (as vLLM does), attention per row group.

With ``graphs`` (default on CUDA) a pure-decode step runs on the static-shape
layout of :mod:`batchsim.calibrate.graphs`, replayed from a CUDA graph on CUDA
(eagerly on a CPU, where its logic is tested); every other step runs eager.
``last_mode`` says which.

:class:`batchsim.calibrate.replica.ExecutorReplica` drives this model with the
simulator's engine and policies.
"""

from __future__ import annotations

import time
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

from batchsim.calibrate.graphs import DecodeGraphs, capture_size, decode_key, kv_buckets, scratch_ids
from batchsim.calibrate.kernels import (DTYPES, KernelTimer, add_rms_norm, bucket, clock, decode_attention,
                               prefill_attention, rope_tables, rotary, silu_and_mul, synchronize, write_kv)
from batchsim.calibrate.models import ModelSpec
from batchsim.sim.errors import InputError
from batchsim.sim.types import StepShape

__all__ = ["Row", "ReferenceModel", "phantom_rows"]


class Row(NamedTuple):
    """One row of a step: ``q`` tokens at positions ``kv..kv+q-1`` of sequence ``key``.

    ``key`` is a request id, or None for a scratch row (padding, synthetic
    steps) whose KV is thrown away; ``sample_at`` is the offset within the
    row whose logits are sampled (None: no sample); ``ids`` the token ids
    (None: zeros).
    """

    key: int | None
    q: int
    kv: int
    sample_at: int | None
    ids: Sequence[int] | None = None


def _call(name: str, fn, *args):
    """The untimed kernel call (``step`` without a timer)."""
    return fn(*args)


def phantom_rows(shape: StepShape) -> list[Row]:
    """Scratch rows for a synthetic step shape (the first ``sampled`` rows sample)."""
    return [Row(None, int(q), int(kv), int(q) - 1 if i < shape.sampled else None)
            for i, (q, kv) in enumerate(zip(shape.q, shape.kv))]


class ReferenceModel:
    """A random-weight Llama (dense, gated MLP, GQA, RoPE) on ``device``.

    ``max_len`` bounds a sequence's KV; ``slots`` is the initial number of KV
    slots (doubled when more rows are live). ``pad`` pads an eager step's token and
    sample counts to :func:`batchsim.calibrate.kernels.bucket` sizes (default: on the
    CPU, see the note there). ``graphs`` runs pure-decode steps on the static layout of
    :mod:`batchsim.calibrate.graphs`, captured as CUDA graphs on CUDA (default: on for
    CUDA, off for a CPU, where it runs the layout eagerly).
    """

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: str = "bf16", *, max_len: int = 2048,
                 slots: int = 16, seed: int = 0, pad: bool | None = None, graphs: bool | None = None) -> None:
        if spec.is_moe or not spec.mlp_gated or spec.attention_bias:
            raise InputError(f"the reference executor runs dense gated Llama-style models; {spec.name} is not "
                             "(MoE, ungated MLP or attention bias)", "--model")
        self.spec, self.device, self.dtype = spec, device, DTYPES[dtype]
        if device.type == "cuda":
            # NOTE: on an H200 (docs/validation.md, "On a GPU") whole stretches of validation
            # steps spent 4.5x the host time of their neighbours with the GPU idle, tied to the
            # batch's shape. The leading suspect is cuDNN attention building a plan per new
            # shape (a decode's context grows every step); flash, memory-efficient and math
            # SDPA need no plans. scripts/sdpa_probe.py tells on the next device run.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.clock = clock(device)  # see batchsim.calibrate.kernels.clock: thread CPU time on a CPU
        self.pad = device.type == "cpu" if pad is None else pad
        self.graphs = device.type == "cuda" if graphs is None else bool(graphs)
        self.decode_graphs = DecodeGraphs(device, capture=device.type == "cuda") if self.graphs else None
        self.last_mode, self.enqueued, self._last = "eager", 0.0, (None, [])
        d, h, hk, dh = spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
        self.h, self.hk, self.dh = h, hk, dh
        gen = torch.Generator(device=device).manual_seed(seed)

        def weight(rows: int, cols: int) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=gen, device=device, dtype=self.dtype)
            return w.mul_(cols ** -0.5)

        ones = torch.ones(d, device=device, dtype=self.dtype)
        f = spec.intermediate_size
        self.embed = weight(spec.vocab_size, d) * d**0.5
        self.layers = [{"ln1": ones, "qkv": weight((h + 2 * hk) * dh, d), "o": weight(d, h * dh), "ln2": ones,
                        "gate_up": weight(2 * f, d), "down": weight(d, f)} for _ in range(spec.num_hidden_layers)]
        self.ln_f, self.lm_head = ones, weight(spec.vocab_size, d)
        self.cap = max_len
        self.cos, self.sin = rope_tables(max_len, dh, device, self.dtype)
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.slot_of: dict[int, int] = {}
        self.free: list[int] = []
        self.epoch = 0  # bumped whenever the KV slabs are reallocated (captured graphs point at them)
        self._pad: int | None = None
        self._alloc(slots)

    # -- KV slots -----------------------------------------------------------------
    def _alloc(self, slots: int) -> None:
        """(Re)allocate the KV slabs with ``slots`` slots, keeping live contents."""
        old = len(self.k_cache[0]) if self.k_cache else 0
        shape = (slots, self.hk, self.cap, self.dh)
        for caches in (self.k_cache, self.v_cache):
            for i in range(self.spec.num_hidden_layers):
                new = torch.zeros(shape, device=self.device, dtype=self.dtype)
                if i < len(caches):
                    new[:old] = caches[i]
                    caches[i] = new
                else:
                    caches.append(new)
        self.free = list(range(slots - 1, old - 1, -1)) + self.free
        self.epoch += 1

    def slot(self, key: int | None) -> int:
        """The slot of sequence ``key`` (allocated on first use); a fresh one for None."""
        if key is not None and key in self.slot_of:
            return self.slot_of[key]
        if not self.free:
            self._alloc(2 * len(self.k_cache[0]))
        s = self.free.pop()
        if key is not None:
            self.slot_of[key] = s
        return s

    def pad_slot(self) -> int:
        """The slot the graph path's padding rows write their KV to and read back (held, never a
        sequence's; taken again after :meth:`reserve` frees every slot)."""
        if self._pad is None:
            self._pad = self.slot(None)
        return self._pad

    def release(self, keys: Sequence[int]) -> None:
        """Free the slots of finished or preempted sequences."""
        for k in keys:
            self.free.append(self.slot_of.pop(k))

    def reset(self) -> None:
        """Free every slot (before a new run)."""
        self.release(list(self.slot_of))

    # -- one step ------------------------------------------------------------------
    def _pack(self, rows: Sequence[Row]) -> dict:
        """Order rows (decodes first, then prefill groups) and build the step's index tensors."""
        dec = [i for i, r in enumerate(rows) if r.q == 1 and r.kv > 0]
        groups: dict[tuple[int, int], list[int]] = {}
        for i, r in enumerate(rows):
            if not (r.q == 1 and r.kv > 0):
                groups.setdefault((r.q, r.kv), []).append(i)
        order = dec + [i for g in groups.values() for i in g]
        need = max((r.kv + r.q for r in rows), default=0)
        if need > self.cap:
            raise InputError(f"a row needs {need} KV positions; the executor holds {self.cap}")
        scratch = [self.slot(None) for i in order if rows[i].key is None]
        it = iter(scratch)
        slots = [self.slot(rows[i].key) if rows[i].key is not None else next(it) for i in order]
        ids: list[int] = []
        pos: list[int] = []
        tok_slot: list[int] = []
        samples: list[int] = []
        sampled_rows: list[int] = []
        for i, s in zip(order, slots):
            r = rows[i]
            if r.sample_at is not None:
                samples.append(len(ids) + r.sample_at)
                sampled_rows.append(i)
            ids.extend(r.ids if r.ids is not None else scratch_ids(r.kv, r.q, s, self.spec.vocab_size))
            pos.extend(range(r.kv, r.kv + r.q))
            tok_slot.extend([s] * r.q)
        n, ns, b = len(ids), len(samples), len(dec)
        n_pad = bucket(n) if self.pad else n
        s_pad = bucket(ns) if self.pad and ns else ns
        pre, row, off = [], b, b
        dev = self.device
        as_t = lambda v: torch.tensor(v, dtype=torch.long, device=dev)  # noqa: E731
        for (q, kv), g in groups.items():
            mine = slots[row:row + len(g)]
            pre.append((off, q, kv, mine, as_t(mine) if len(mine) > 1 else None))
            row, off = row + len(g), off + q * len(g)
        lens = [rows[i].kv + 1 for i in dec]
        return {"n": n, "ids": as_t(ids + [0] * (n_pad - n)), "pos": as_t(pos + [0] * (n_pad - n)),
                "tok_slot": as_t(tok_slot), "tok_pos": as_t(pos), "samples": as_t(samples + [0] * (s_pad - ns)),
                "picks": [(i, j) for j, i in enumerate(sampled_rows)],  # (row, its entry in the samples)
                "dec": b, "dec_slots": as_t(slots[:b]), "dec_lens": as_t(lens),
                "dec_max": max(lens, default=0), "pre": pre, "scratch": scratch}

    @torch.inference_mode()
    def step(self, rows: Sequence[Row], timer: KernelTimer | None = None) -> list[int | None]:
        """Run one step; returns each row's sampled token id (None where it does not sample).

        ``timer`` (a :class:`~batchsim.calibrate.kernels.KernelTimer`) times every kernel in
        place (always eager). Otherwise, with ``graphs``, a pure-decode step that fits a
        capture size runs on the static layout (:mod:`batchsim.calibrate.graphs`);
        ``last_mode`` says how the step ran, ``enqueued`` when the host had queued it.
        """
        key = decode_key(rows, self.cap) if self.graphs and timer is None else None
        if key is None:
            p = self._pack(rows)
            out, mode = self._forward(p, timer or _call), "eager"
        else:
            p = self.decode_graphs.inputs_for(self, rows, key)
            out, mode = self.decode_graphs.run(key, lambda: self._forward(p, _call))
        self.enqueued = time.perf_counter()
        result: list[int | None] = [None] * len(rows)
        if out is not None and p["picks"]:
            ids = out[1].tolist()
            for i, j in p["picks"]:
                result[i] = ids[j]
        synchronize(self.device)
        self.free.extend(p["scratch"])
        self.last_mode, self._last = mode, (out[0] if out is not None else None, p["picks"])
        return result

    def last_logits(self) -> dict[int, torch.Tensor]:
        """The last step's logits by row index (sampling rows only). On the graph path they are
        the graph's output buffer, overwritten when it replays: copy what must outlive that."""
        logits, picks = self._last
        return {i: logits[j] for i, j in picks} if logits is not None else {}

    def _forward(self, p: dict, k) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The step's device work on an input layout (:meth:`_pack`'s, or the static one of
        :meth:`batchsim.calibrate.graphs.DecodeGraphs.inputs_for`): logits and argmax ids of the
        ``samples`` rows, None when no row samples. No host synchronisation: it may be captured."""
        n, h, hk, dh = p["n"], self.h, self.hk, self.dh
        x = k("embedding", F.embedding, p["ids"], self.embed)
        cos = self.cos.index_select(0, p["pos"]).unsqueeze(1)
        sin = self.sin.index_select(0, p["pos"]).unsqueeze(1)
        res = None
        for i, layer in enumerate(self.layers):
            y, res = k("norms", add_rms_norm, x, res, layer["ln1"])
            qkv = k("qkv_proj", F.linear, y, layer["qkv"])
            qk = k("rotary", rotary, qkv[:, : (h + hk) * dh].view(-1, h + hk, dh), cos, sin)
            kc, vc = self.k_cache[i], self.v_cache[i]
            k("kv_cache_write", write_kv, kc, vc, qk[:n, h:], qkv[:n, (h + hk) * dh:].view(n, hk, dh),
              p["tok_slot"], p["tok_pos"])
            attn = torch.empty(qkv.shape[0], h * dh, device=self.device, dtype=self.dtype)
            if qkv.shape[0] > n:
                attn[n:].zero_()
            b = p["dec"]
            if b:
                attn[:b] = k("attention_decode", decode_attention, qk[:b, :h], kc, vc, p["dec_slots"],
                             p["dec_lens"], p["dec_max"])
            for off, q, kv, slots, idx in p["pre"]:
                end = off + q * len(slots)
                attn[off:end] = k("attention_prefill", prefill_attention, qk[off:end, :h], kc, vc, slots, kv, idx)
            x = k("o_proj", F.linear, attn, layer["o"])
            y, res = k("norms", add_rms_norm, x, res, layer["ln2"])
            gate_up = k("mlp_gate_up", F.linear, y, layer["gate_up"])
            x = k("mlp_down", F.linear, k("mlp_act", silu_and_mul, gate_up), layer["down"])
        y, _ = k("norms", add_rms_norm, x, res, self.ln_f)
        if not p["samples"].numel():  # (eager, no row samples; the static layout always has P)
            return None
        logits = k("lm_head", F.linear, y.index_select(0, p["samples"]), self.lm_head)
        return logits, logits.argmax(dim=-1)

    def profile_steps(self, shapes: Sequence[StepShape], rounds: int = 5, kernels: bool = False,
                      progress=None) -> tuple[list[float], list[dict[str, list[float]]]]:
        """Median wall time of each synthetic step shape (scratch rows) over ``rounds`` rounds,
        after one untimed run each; with ``kernels``, every kernel's times too (all layers, rounds).

        With ``kernels`` each step reserves just the KV it needs (:meth:`reserve`;
        order the shapes by KV need to keep reallocations rare). Whole steps run through
        :meth:`step` as a run's do (pure decodes on the graph path with ``graphs``);
        ``step_modes`` records how each shape's timed runs ran.
        """
        rows = [phantom_rows(s) for s in shapes]
        self.device_idle: list[float] = []  # KernelTimer.idle_fraction of every timed step (GPU)
        walls: list[list[float]] = [[] for _ in shapes]
        kern: list[dict[str, list[float]]] = [{} for _ in shapes]
        modes: list[set[str]] = [set() for _ in shapes]
        for r in range(rounds + 1):
            for i, row in enumerate(rows):
                # (one slot more than the rows: the graph path's padding rows hold one)
                self.reserve(len(row) + 1, max(x.kv + x.q for x in row), shrink=kernels)
                if kernels and r:  # NOTE: a separate timed run: the timer's own cost stays out of the wall time
                    timer = KernelTimer(self.device)
                    self.step(row, timer)
                    for name, ts in timer.times().items():
                        kern[i].setdefault(name, []).extend(ts)
                    self.device_idle.append(timer.idle_fraction())
                if r and self._would_capture(row):
                    self.step(row)  # NOTE: untimed: a reserve() above dropped the graphs; capture first
                t0 = self.clock()
                self.step(row)
                if r:  # round 0 warms up (JIT, first touch, graph capture)
                    walls[i].append(self.clock() - t0)
                    modes[i].add(self.last_mode)
                if progress:
                    progress(r * len(rows) + i + 1, (rounds + 1) * len(rows))
        self.step_modes = ["+".join(sorted(m)) for m in modes]
        return [sorted(w)[len(w) // 2] for w in walls], kern

    def _would_capture(self, rows: Sequence[Row]) -> bool:
        """Whether :meth:`step` would capture a CUDA graph for these rows (none is held for
        their key, or the KV slabs were reallocated since)."""
        g = self.decode_graphs
        key = decode_key(rows, self.cap) if g is not None and g.capture else None
        return key is not None and (g.epoch != self.epoch or key not in g.graphs)

    def time_steps(self, shapes: Sequence[StepShape], rounds: int = 5) -> list[float]:
        """Median wall time of each synthetic step shape (see :meth:`profile_steps`)."""
        return self.profile_steps(shapes, rounds)[0]

    def reserve(self, slots: int, cap: int, shrink: bool = False) -> None:
        """Make the KV slabs hold ``slots`` sequences of ``cap`` tokens (no live sequence may be
        held): grown when too small and, with ``shrink``, cut when over 4x too large (a
        calibration grid's longest prefill and largest decode batch need not fit at once)."""
        have = len(self.k_cache[0]), self.cap
        if slots <= have[0] and cap <= have[1] and not (shrink and have[0] * have[1] > 4 * slots * cap):
            return
        if self.slot_of:
            raise RuntimeError("reserve() with live sequences")
        self.k_cache.clear()
        self.v_cache.clear()
        self.free, self.cap, self._pad = [], max(cap, 1), None
        if self.cap > len(self.cos):
            self.cos, self.sin = rope_tables(self.cap, self.dh, self.device, self.dtype)
        self._alloc(max(slots, 1))

    def warm_up(self, max_tokens: int, max_rows: int, max_prompt: int = 0, graph_rows: int = 0) -> None:
        """Compile what a run will meet, then run a few steps: on the CPU every padded GEMM
        size up to ``max_tokens`` rows, causal attention of every prompt length up to
        ``max_prompt`` and decode attention over every context the KV slabs hold. On CUDA
        with graphs, capture every decode graph of up to ``graph_rows`` rows over every KV
        bucket the slabs hold (:meth:`capture_decodes`).

        NOTE: CPU SDPA compiles its kernels per shape too: a prompt length seen for
        the first time cost 0.5-6 ms more than its next run (thread time), most of a
        tiny model's prefill step. Chunks over a cached context are not covered.
        """
        if self.pad:
            with torch.inference_mode():
                self._warm_gemms(max_tokens, max_rows)
                kc, vc = self.k_cache[0], self.v_cache[0]
                for n in range(1, min(max_prompt, self.cap) + 1):
                    prefill_attention(torch.zeros(n, self.h, self.dh, device=self.device, dtype=self.dtype),
                                      kc, vc, [0], 0)
                one = torch.zeros(1, self.h, self.dh, device=self.device, dtype=self.dtype)
                slot = torch.zeros(1, dtype=torch.long, device=self.device)
                for n in range(1, self.cap + 1):
                    decode_attention(one, kc, vc, slot, torch.full((1,), n, device=self.device), n)
        kv, q = min(64, self.cap - 1), min(128, self.cap)
        shapes = [StepShape.of([(1, kv)] * b) for b in (1, 4, 16)] + [StepShape.of([(n, 0)]) for n in (min(16, q), q)]
        self.profile_steps(shapes, rounds=1)
        if graph_rows:
            self.capture_decodes(graph_rows)

    def capture_decodes(self, rows: int) -> int:
        """Capture the decode graph of every capture size holding up to ``rows`` rows over every KV
        bucket the slabs hold (a no-op without CUDA graphs); returns how many were captured.

        NOTE: eagerly, for this bounded set, not lazily on first use: a run's decode steps
        then replay from their first step, and no timed step pays a capture (a validation's
        untimed pass covers one policy only). A graph lives only as long as the KV slabs it
        writes: the slabs are grown for the largest batch first, since growing them later
        drops every graph. Largest batches are captured first, as vLLM and SGLang do, so
        the smaller graphs reuse the shared pool's blocks.
        """
        g = self.decode_graphs
        if g is None or not g.capture:
            return 0
        top = capture_size(rows) or rows
        held = [self.slot(None) for _ in range(top + 1)]  # (grow now, before any capture)
        self.free.extend(reversed(held))
        self.pad_slot()
        before = g.captured
        for size in sorted({capture_size(b) for b in range(1, top + 1)} - {None}, reverse=True):
            for kv in kv_buckets(self.cap):
                if kv > 1:
                    self.step([Row(None, 1, kv - 1, 0)] * size)
        return g.captured - before

    def _warm_gemms(self, max_tokens: int, max_rows: int) -> None:
        layer, d = self.layers[0], self.spec.hidden_size
        for n in sorted({bucket(n) for n in range(1, max_tokens + 1)}):
            x = torch.zeros(n, d, device=self.device, dtype=self.dtype)
            for w in (layer["qkv"], layer["gate_up"]):
                F.linear(x, w)
            F.linear(torch.zeros(n, self.h * self.dh, device=self.device, dtype=self.dtype), layer["o"])
            F.linear(torch.zeros(n, self.spec.intermediate_size, device=self.device, dtype=self.dtype), layer["down"])
            if n <= bucket(max_rows):
                F.linear(x, self.lm_head)
