"""The roofline cost model: what one forward step costs on one replica.

:class:`RooflineCostModel` implements :class:`batchsim.sim.protocols.CostModel`. It
prices a :class:`~batchsim.sim.types.StepShape` operator by operator on one
tensor-parallel shard (all shards run in lockstep, so a shard's time is the
replica's time): each kernel takes

    max(flops / (peak_flops * e_c(tokens)), bytes / (peak_bw * e_m(bytes))) + launch

with ``e_c`` / ``e_m`` read from the hardware profile's curves for the
operator's class; all-reduces take ``latency + 2(t-1)/t * bytes / link_bw``;
the host adds a constant plus a per-sequence cost. The dense operators run at
the step's ``dense_tokens`` when it is padded to a CUDA graph's size. FLOPs and bytes are
reported per replica (all shards) so MFU/MBU divide by per-replica peaks.

``price`` runs once per simulated step. Everything that depends only on the
step's token and sample counts is memoised per ``(tokens, sampled)``; only
attention (which depends on every row's context) is recomputed, from a
handful of numpy reductions over the rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from batchsim.calibrate.curves import ClassEfficiency
from batchsim.calibrate.hardware import HardwareProfile
from batchsim.calibrate.models import KV_DTYPES, WEIGHT_DTYPES, ModelSpec, check_dtype
from batchsim.calibrate.pricing import DenseTable, OperatorTable, PricingTable
from batchsim.calibrate.work import B_ACT, ShardShape, Work
from batchsim.sim.errors import InputError
from batchsim.sim.types import OpCost, StepCost, StepShape

__all__ = ["RooflineCostModel"]

_ZERO = StepCost(seconds=0.0, flops=0.0, bytes=0.0)
_CACHE_LIMIT = 1 << 16

# the reductions ndarray.sum / .max call, minus the method dispatch (same results)
_sum, _max, _nonzero, _dot = np.add.reduce, np.maximum.reduce, np.count_nonzero, np.dot
_I64 = np.dtype(np.int64)
_ONES: dict[int, bytes] = {}  # n -> bytes of np.ones(n, int64), to spot all-decode steps


def _ones(n: int) -> bytes:
    b = np.ones(n, dtype=np.int64).tobytes()
    if n <= 4096:
        _ONES[n] = b
    return b


def _make_step_cost():
    """A constructor of :class:`StepCost` from positional fields, minus the frozen
    dataclass's per-field ``object.__setattr__`` (a third of a decode step's price).

    It fills the instance dict in field order, which gives an object equal in
    every way to one from ``StepCost(...)``; it checks that on a probe and
    falls back to the class itself if StepCost ever changes shape.
    """
    names = ("seconds", "flops", "bytes", "compute_s", "memory_s", "network_s", "overhead_s", "out_of_range",
             "breakdown")
    new = object.__new__

    def fast(seconds, flops, nbytes, compute_s, memory_s, network_s, overhead_s, out_of_range):
        c = new(StepCost)
        d = c.__dict__
        d["seconds"] = seconds
        d["flops"] = flops
        d["bytes"] = nbytes
        d["compute_s"] = compute_s
        d["memory_s"] = memory_s
        d["network_s"] = network_s
        d["overhead_s"] = overhead_s
        d["out_of_range"] = out_of_range
        d["breakdown"] = None
        return c

    def plain(seconds, flops, nbytes, compute_s, memory_s, network_s, overhead_s, out_of_range):
        return StepCost(seconds, flops, nbytes, compute_s, memory_s, network_s, overhead_s, out_of_range)

    try:
        args = (1.5, 2.5, 3.5, 0.25, 0.75, 0.125, 0.375, 2)
        a, b = fast(*args), plain(*args)
        same = (tuple(f.name for f in dataclasses.fields(StepCost)) == names
                and not hasattr(StepCost, "__post_init__") and a == b and hash(a) == hash(b)
                and repr(a) == repr(b) and list(vars(a).items()) == list(vars(b).items()))
    except Exception:  # noqa: BLE001 - any surprise: use the class itself
        same = False
    return fast if same else plain


_step_cost = _make_step_cost()


def _denominator(cache: dict, tokens: int, eff, peak: float) -> float:
    """``peak * eff.compute(tokens)`` (an attention kernel's compute rate), remembered in ``cache``."""
    den = peak * eff.compute(tokens)
    if len(cache) < _CACHE_LIMIT:
        cache[tokens] = den
    return den


class RooflineCostModel:
    """Prices steps of ``model`` on ``hardware`` at tensor-parallel size ``tp``.

    ``dtype`` is the weight dtype (bf16, fp16, fp8, int4); ``kv_dtype`` the KV
    cache dtype (default: ``dtype``, bf16 for int4). fp8 weights compute in
    fp8 where the profile has an fp8 peak, else in 16 bits (weight-only);
    int4 weights compute in fp16 (W4A16).
    """

    def __init__(self, model: ModelSpec, hardware: HardwareProfile, tp: int = 1,
                 dtype: str = "bf16", kv_dtype: str | None = None) -> None:
        check_dtype(dtype, WEIGHT_DTYPES, "weight dtype")
        if kv_dtype is None:
            kv_dtype = "bf16" if dtype == "int4" else dtype
        check_dtype(kv_dtype, KV_DTYPES, "KV cache dtype")
        if tp < 1:
            raise InputError(f"tp must be >= 1, got {tp}")
        self.model, self.hardware, self.tp = model, hardware, tp
        self.dtype, self.kv_dtype = dtype, kv_dtype
        self.shard = ShardShape.of(model, tp, dtype, kv_dtype)
        self.compute_dtype = {"int4": "fp16", "fp8": "fp8" if "fp8" in hardware.peak_tflops else "bf16"}.get(dtype, dtype)
        self._gemm_peak = hardware.peak_flops(self.compute_dtype)
        self._peak16 = hardware.peak_flops("bf16")
        self._bw = hardware.bandwidth
        self._launch = hardware.launch_latency_us * 1e-6
        self._eff = {c: ClassEfficiency(e) for c, e in hardware.efficiency.items()}
        link = hardware.interconnect
        self._link_bw = link.bandwidth_gbs * 1e9 * link.efficiency
        self._link_lat = link.latency_us * 1e-6
        host = hardware.host_overhead
        # (per step, per sequence, per step with decode rows: per step + the decode extra)
        step_us = host.step_us(tp)
        self._host = (step_us * 1e-6, host.per_seq_us * 1e-6,
                      step_us * 1e-6 + host.per_decode_step_us * 1e-6)
        fe = hardware.frontend
        # (the engine's frontend terms in seconds: in per request, per prompt token; out per step, per token)
        self.frontend = (fe.per_request_us * 1e-6, fe.per_prompt_token_us * 1e-6, fe.per_step_us * 1e-6,
                         fe.per_output_token_us * 1e-6) if fe.active else None
        self._dense_cache: dict[tuple[int, int], tuple] = {}
        self._dense_tokens: dict[int, tuple] = {}  # _dense's totals before the LM head, by tokens
        # per replica: what MFU and MBU divide by
        self.peak_flops = tp * self._gemm_peak
        self.peak_bandwidth = tp * self._bw
        self.weight_bytes_per_gpu = self.shard.weight_bytes()
        self.kv_bytes_per_token = tp * self.shard.kv_bytes_per_token
        self._precompute()

    def _precompute(self) -> None:
        """Per-model constants of :meth:`price`'s fast path; None turns it off."""
        m, sh = self.model, self.shard
        L, dh = m.num_hidden_layers, m.head_dim
        h, k = sh.heads, sh.kv_heads
        # exactly ShardShape.attention's constants and _roofline's lookups
        kv_elt = 2 * k * dh * sh.b_kv
        qo = h * dh * B_ACT * 2
        l_launch = L * self._launch
        host0, host1, host0d = self._host
        pre = self._eff.get("attention") or self._eff.get("attention_prefill")
        dec = self._eff.get("attention") or self._eff.get("attention_decode")
        self._attn = None
        if pre is not None and dec is not None:
            self._attn = (L, L * 4.0, h, dh, kv_elt, qo, self._peak16, self._bw, l_launch, host0, host1, host0d,
                          pre, pre.memory, pre.measured, {}, dec, dec.memory, dec.measured, {})

    def pricing_table(self) -> PricingTable | None:
        """The fast path's constants by name (the compiled core's input), or None when
        the profile has no attention curves (then only :meth:`price`'s plain path runs)."""
        c = self._attn
        if c is None:
            return None
        (L, _L4, h, dh, kv_elt, qo, peak, bw, l_launch, host0, host1, host0d,
         pre, _pm, pre_range, _pd, dec, _dm, dec_range, _dd) = c

        def attention(eff, name: str, rng) -> OperatorTable:
            return OperatorTable(name="attention", op_class=name, kernels=L, peak_flops=peak,
                                 compute=eff.compute.table(), memory=eff.memory.table(), measured=rng)

        return PricingTable(
            layers=L, q_heads=h, head_dim=dh, tp=self.tp, kv_bytes_per_token_layer=kv_elt,
            qo_bytes_per_token_layer=qo, attention_peak_flops=peak, bandwidth=bw, attention_launch_s=l_launch,
            host_step_s=host0, host_seq_s=host1, host_decode_step_s=host0d,
            prefill=attention(pre, "attention_prefill", pre_range),
            decode=attention(dec, "attention_decode", dec_range), dense=self._dense_table())

    def _dense_table(self) -> DenseTable | None:
        """The dense operators' constants, in ShardShape.dense's order then the LM head (None for MoE)."""
        m, sh = self.model, self.shard
        if m.is_moe:
            return None
        ops = []
        for w in [*sh.dense(1, 0), sh.lm_head(1)]:
            eff = self._eff.get(w.name) or self._eff.get(w.op_class)
            if eff is None:
                return None
            ops.append(OperatorTable(name=w.name, op_class=w.op_class, kernels=w.kernels,
                                     peak_flops=self._gemm_peak if w.op_class == "gemm" else self._peak16,
                                     compute=eff.compute.table(), memory=eff.memory.table(), measured=eff.measured))
        f = sh.mlp_width
        return DenseTable(hidden_size=m.hidden_size, q_heads=sh.heads, kv_heads=sh.kv_heads, qkv_width=sh.qkv_width,
                          rotary_width=(sh.heads + sh.kv_heads) * m.head_dim, vocab=sh.vocab, mlp_width=f,
                          mlp_up_width=2 * f if m.mlp_gated else f, weight_bytes=sh.b_w, kv_bytes=sh.b_kv,
                          launch_s=self._launch, link_latency_s=self._link_lat, link_bandwidth=self._link_bw,
                          operators=tuple(ops))

    def dense_totals(self, tokens: int, sampled: int) -> tuple:
        """The non-attention operators' totals of a step, ``(compute_s, memory_s, network_s,
        overhead_s, flops, bytes, out_of_range)`` per shard (memoised; what the core asks for MoE models)."""
        return self._dense(tokens, sampled)

    # -- pricing -------------------------------------------------------------
    # NOTE: price is the simulator's hot path. It inlines ShardShape.attention
    # and _roofline for the two attention operators (per-model constants
    # precomputed in _precompute) with every floating-point operation kept in
    # the original order, so results are bit-identical to the plain code (kept
    # as _price_slow, which also serves breakdowns and profiles the fast path
    # does not cover).
    def price(self, shape: StepShape, breakdown: bool = False) -> StepCost:
        """What one step costs; ``breakdown`` adds per-operator figures (slower)."""
        q, kv = shape.q, shape.kv
        n = q.shape[0]
        if n == 0:
            return _ZERO
        if q.dtype == _I64 and q.tobytes() == (_ONES.get(n) or _ones(n)):
            T, ones = n, True  # what the reductions below find for all-ones rows, without reducing
        else:
            T = int(_sum(q))
            if T == 0:  # only billed-but-empty rows: nothing runs
                return _ZERO
            ones = T == n and _max(q) == 1
        if ones:
            # NOTE: fast path, every row is one token (decodes, and 1-token prompts with kv == 0);
            # four reductions instead of nine, which is most of a decode step's price.
            n_dec = int(_nonzero(kv))
            ctx_dec = int(_sum(kv)) + n_dec
            pairs = pre_kv = float(n - n_dec)
        else:
            kv1 = kv[q == 1]
            n_dec = int(_nonzero(kv1))
            ctx_dec = int(_sum(kv1)) + n_dec
            # sum over rows of q*(2kv+q+1) = 2 * causal pairs; a decode row contributes 2*(kv+1)
            pairs = (2 * int(_dot(q, kv)) + int(_dot(q, q)) + T) / 2.0 - ctx_dec
            # rows with q == 0 (billed padding) compute nothing and read no KV
            kv_read = _sum(kv) if _nonzero(q) == n else _sum(kv[q > 0])
            pre_kv = int(kv_read) + T - ctx_dec
        c = self._attn
        # the dense operators run at a CUDA graph's padded token count when the step has one
        D = shape.dense_tokens if shape.dense_tokens > T else T
        if breakdown or c is None:
            return self._price_slow(shape, breakdown, T, n, n_dec, ctx_dec, pairs, pre_kv, D)
        return self._price_fast(c, n, T, n_dec, ctx_dec, pairs, pre_kv, shape.sampled, D)

    def _price_fast(self, c: tuple, n: int, T: int, n_dec: int, ctx_dec: int, pairs: float, pre_kv,
                    sampled: int, D: int) -> StepCost:
        """:meth:`price`'s fast path from the step's reductions (``D``: the dense operators' tokens)."""
        (L, L4, h, dh, kv_elt, qo, peak, bw, l_launch, host0, host1, host0d,
         pre_eff, pre_mem, pre_range, pre_den, dec_eff, dec_mem, dec_range, dec_den) = c
        hit = self._dense_cache.get((D, sampled))
        if hit is None:
            hit = self._dense(D, sampled)
        comp, mem, net, over, flops, nbytes, oor = hit
        # ShardShape.attention's Work items priced as _roofline would, prefill then decode
        for tokens, wf, wb, eff, mem_curve, rng, dens in (
                (T - n_dec, L4 * pairs * h * dh, L * (pre_kv * kv_elt + (T - n_dec) * qo),
                 pre_eff, pre_mem, pre_range, pre_den),
                (n_dec, L4 * ctx_dec * h * dh, L * (ctx_dec * kv_elt + n_dec * qo),
                 dec_eff, dec_mem, dec_range, dec_den)):
            if not tokens:
                continue
            per = wb / L
            tc = wf / (dens.get(tokens) or _denominator(dens, tokens, eff, peak)) if wf else 0.0
            tm = wb / (bw * mem_curve(per)) if wb else 0.0
            if tc >= tm:
                comp += tc
            else:
                mem += tm
            over += l_launch
            flops += wf
            nbytes += wb
            if rng is not None and not (rng[0] <= tokens <= rng[1] and rng[2] <= per <= rng[3]):
                oor += 1
        over += (host0d if n_dec else host0) + host1 * n
        t = self.tp
        return _step_cost(comp + mem + net + over, flops * t, nbytes * t, comp, mem, net, over, oor)

    def _price_slow(self, shape: StepShape, breakdown: bool, T: int, n: int, n_dec: int, ctx_dec: int,
                    pairs: float, pre_kv: float, D: int) -> StepCost:
        """:meth:`price` from the row sums, through :class:`Work` items (breakdowns, uncommon profiles)."""
        pre, dcd = self.shard.attention(T - n_dec, pairs, pre_kv, n_dec, ctx_dec)
        host = self._host[2 if n_dec else 0] + self._host[1] * n
        if breakdown:
            return self._priced_breakdown(D, shape.sampled, pre, dcd, host)
        comp, mem, net, over, flops, nbytes, oor = self._dense(D, shape.sampled)
        comp, mem, over, flops, nbytes, oor = self._fold([w for w in (pre, dcd) if w is not None],
                                                         (comp, mem, over, flops, nbytes, oor))
        over += host
        t = self.tp
        return StepCost(seconds=comp + mem + net + over, flops=flops * t, bytes=nbytes * t, compute_s=comp,
                        memory_s=mem, network_s=net, overhead_s=over, out_of_range=oor)

    def _roofline(self, w: Work) -> tuple[float, float, int]:
        """(compute time, memory time, out-of-range 0/1) of ``w``, summed over its kernels."""
        eff = self._eff.get(w.name) or self._eff[w.op_class]  # an operator's own curves override its class's
        k = w.kernels
        per_bytes = w.bytes / k
        peak = self._gemm_peak if w.op_class == "gemm" else self._peak16
        tc = w.flops / (peak * eff.compute(w.tokens)) if w.flops else 0.0
        tm = w.bytes / (self._bw * eff.memory(per_bytes)) if w.bytes else 0.0
        return tc, tm, int(eff.out_of_range(w.tokens, per_bytes))

    def _allreduce(self, tokens: int) -> tuple[float, float, int]:
        """(seconds, bytes sent per GPU, count) of the step's all-reduces (2 per layer)."""
        if self.tp == 1:
            return 0.0, 0.0, 0
        count = 2 * self.model.num_hidden_layers
        sent = self.shard.allreduce_bytes(tokens)
        return count * (self._link_lat + sent / self._link_bw), count * sent, count

    def _dense(self, tokens: int, sampled: int) -> tuple:
        """Memoised totals of the non-attention operators for ``(tokens, sampled)``."""
        key = (tokens, sampled)
        hit = self._dense_cache.get(key)
        if hit is not None:
            return hit
        # NOTE: the token-count operators' running totals are memoised by tokens alone
        # (a prefill's token count recurs with other sampled counts), then the LM head,
        # last in shard.dense's order, is added as the one loop over all of them would.
        part = self._dense_tokens.get(tokens)
        if part is None:
            part = self._fold(self.shard.dense(tokens, 0), (0.0, 0.0, 0.0, 0.0, 0.0, 0))
            if len(self._dense_tokens) >= _CACHE_LIMIT:
                self._dense_tokens.clear()
            self._dense_tokens[tokens] = part
        comp, mem, over, flops, nbytes, oor = (
            self._fold((self.shard.lm_head(sampled),), part) if sampled > 0 else part)
        net, sent, _ = self._allreduce(tokens)
        out = (comp, mem, net, over, flops, nbytes + sent, oor)
        if len(self._dense_cache) >= _CACHE_LIMIT:
            self._dense_cache.clear()
        self._dense_cache[key] = out
        return out

    def _fold(self, works, totals: tuple) -> tuple:
        """``totals`` (compute, memory, launch, FLOPs, bytes, out-of-range) plus each of
        ``works`` in order, as :meth:`_dense` sums them."""
        comp, mem, over, flops, nbytes, oor = totals
        for w in works:
            tc, tm, o = self._roofline(w)
            if tc >= tm:
                comp += tc
            else:
                mem += tm
            over += w.kernels * self._launch
            flops += w.flops
            nbytes += w.bytes
            oor += o
        return comp, mem, over, flops, nbytes, oor

    def _priced_breakdown(self, tokens: int, sampled: int, pre: Work | None, dcd: Work | None,
                          host: float) -> StepCost:
        """The slow path: one :class:`OpCost` per operator, in execution order."""
        totals = {"compute": 0.0, "memory": 0.0, "launch": 0.0, "oor": 0}
        attention = [w for w in (pre, dcd) if w is not None]
        ops: list[OpCost] = []
        for w in self.shard.dense(tokens, sampled):
            ops.append(self._op(w, totals))
            if w.name == "kv_cache_write" and attention:
                ops.append(self._merge([self._op(a, totals) for a in attention]))
        net, sent, count = self._allreduce(tokens)
        if count:
            ops.append(OpCost("allreduce", net, 0.0, sent * self.tp, "network"))
        ops.append(OpCost("host", host, 0.0, 0.0, "overhead"))
        over = totals["launch"] + host
        return StepCost(seconds=totals["compute"] + totals["memory"] + net + over,
                        flops=sum(o.flops for o in ops), bytes=sum(o.bytes for o in ops),
                        compute_s=totals["compute"], memory_s=totals["memory"], network_s=net,
                        overhead_s=over, out_of_range=int(totals["oor"]), breakdown=tuple(ops))

    def _op(self, w: Work, totals: dict[str, float]) -> OpCost:
        tc, tm, oor = self._roofline(w)
        bound = "compute" if tc >= tm else "memory"
        launch = w.kernels * self._launch
        totals[bound] += max(tc, tm)
        totals["launch"] += launch
        totals["oor"] += oor
        return OpCost(w.name, max(tc, tm) + launch, w.flops * self.tp, w.bytes * self.tp, bound)

    @staticmethod
    def _merge(parts: list[OpCost]) -> OpCost:
        """Prefill and decode attention of one step shown as one ``attention`` operator."""
        if len(parts) == 1:
            return parts[0]
        main = max(parts, key=lambda o: o.seconds)
        return OpCost("attention", sum(o.seconds for o in parts), sum(o.flops for o in parts),
                      sum(o.bytes for o in parts), main.bound)

    # -- helpers for validation and calibration --------------------------------
    def gemm_seconds(self, m: int, k: int, n: int) -> float:
        """Kernel time of one (m x k) @ (k x n) GEMM with this model's weight dtype (no launch)."""
        tc, tm, _ = self._roofline(self.shard.gemm("gemm", 1, m, k, n))
        return max(tc, tm)

    # -- memory ----------------------------------------------------------------
    def kv_capacity_tokens(self, gpu_memory_utilization: float, max_num_batched_tokens: int = 8192,
                           max_num_seqs: int = 256, memory_of: str = "total") -> int:
        """Tokens of KV cache one replica holds (every shard holds the same tokens).

        (memory x utilization - weights/tp - runtime reserve - activations) /
        KV bytes per token, per GPU; with ``memory_of="free"`` (TensorRT-LLM's
        ``free_gpu_memory_fraction``) utilization x (memory - weights/tp - reserve
        - activations). Raises InputError when nothing is left.
        """
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise InputError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        hw, gib = self.hardware, 2.0**30
        usable = hw.memory_bytes * gpu_memory_utilization
        reserve = hw.memory_reserve_gib * gib
        act = self.shard.activation_bytes(max_num_batched_tokens, max_num_seqs)
        free = usable - self.weight_bytes_per_gpu - reserve - act
        if memory_of == "free":
            free = (hw.memory_bytes - self.weight_bytes_per_gpu - reserve - act) * gpu_memory_utilization
        per_token = self.shard.kv_bytes_per_token
        if free < per_token:
            raise InputError(
                f"{self.model.name} ({self.dtype}) does not fit on {hw.name} at tp={self.tp}: "
                f"{gpu_memory_utilization:g} x {hw.memory_gib:g} GiB = {usable / gib:.1f} GiB per GPU, but weights "
                f"take {self.weight_bytes_per_gpu / gib:.1f} GiB, runtime reserve {reserve / gib:.1f} GiB and "
                f"activations {act / gib:.1f} GiB, leaving {free / gib:.1f} GiB for the KV cache; "
                f"raise tensor_parallel_size or use a smaller dtype")
        return int(free // per_token)

    def kv_capacity_blocks(self, gpu_memory_utilization: float, block_size: int = 16, **kw: int) -> int:
        """KV capacity in paged blocks of ``block_size`` tokens."""
        return self.kv_capacity_tokens(gpu_memory_utilization, **kw) // block_size
