"""The roofline cost model: what one forward step costs on one replica.

:class:`RooflineCostModel` implements :class:`sim.protocols.CostModel`. It
prices a :class:`~sim.types.StepShape` operator by operator on one
tensor-parallel shard (all shards run in lockstep, so a shard's time is the
replica's time): each kernel takes

    max(flops / (peak_flops * e_c(tokens)), bytes / (peak_bw * e_m(bytes))) + launch

with ``e_c`` / ``e_m`` read from the hardware profile's curves for the
operator's class; all-reduces take ``latency + 2(t-1)/t * bytes / link_bw``;
the host adds a constant plus a per-sequence cost. FLOPs and bytes are
reported per replica (all shards) so MFU/MBU divide by per-replica peaks.

``price`` runs once per simulated step. Everything that depends only on the
step's token and sample counts is memoised per ``(tokens, sampled)``; only
attention (which depends on every row's context) is recomputed, from a
handful of numpy reductions over the rows.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, bisect_right
from typing import NamedTuple

import numpy as np

from calibrate.curves import ClassEfficiency
from calibrate.hardware import HardwareProfile
from calibrate.models import KV_DTYPES, WEIGHT_DTYPES, ModelSpec, check_dtype
from calibrate.work import B_ACT, ShardShape, Work
from sim.errors import InputError
from sim.types import OpCost, StepCost, StepShape

__all__ = ["RooflineCostModel", "DecodeRun"]

_ZERO = StepCost(seconds=0.0, flops=0.0, bytes=0.0)
_CACHE_LIMIT = 1 << 16
_EXACT = 1 << 53  # integers below this are exact doubles, and so are their sums and products below it

# the reductions ndarray.sum / .max call, minus the method dispatch (same results)
_sum, _max, _nonzero, _dot = np.add.reduce, np.maximum.reduce, np.count_nonzero, np.dot
_arange, _array = np.arange, np.array
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


class DecodeRun(NamedTuple):
    """Costs of ``count`` consecutive all-decode steps, one array element per step
    (the fields of :class:`~sim.types.StepCost`)."""

    seconds: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    compute_s: np.ndarray
    memory_s: np.ndarray
    network_s: float
    overhead_s: float
    out_of_range: np.ndarray

    def step(self, j: int) -> StepCost:
        """Step ``j`` as a :class:`StepCost`."""
        net, over = self.network_s, self.overhead_s
        if type(net) is np.ndarray:  # (price_decode_segments: per step)
            net, over = float(net[j]), float(over[j])
        return _step_cost(float(self.seconds[j]), float(self.flops[j]), float(self.bytes[j]),
                          float(self.compute_s[j]), float(self.memory_s[j]), net, over,
                          int(self.out_of_range[j]))


def _from_sums(n: int, sums: tuple) -> tuple:
    """``(T, n_dec, ctx_dec, pairs, pre_kv)`` of a step of ``n`` rows from its row sums
    (``StepShape.sums``): the integers :meth:`RooflineCostModel.price` reduces rows to."""
    T, n_dec, ctx_dec, qkv, qq, kv_read = sums
    if T == n and qq == n:  # every row one token: the fast path's expressions
        pairs = pre_kv = float(n - n_dec)
    else:
        pairs = (2 * qkv + qq + T) / 2.0 - ctx_dec
        pre_kv = kv_read + T - ctx_dec
    return T, n_dec, ctx_dec, pairs, pre_kv


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
        self._host = (host.per_step_us * 1e-6, host.per_seq_us * 1e-6,
                      host.per_step_us * 1e-6 + host.per_decode_step_us * 1e-6)
        self._dense_cache: dict[tuple[int, int], tuple] = {}
        self._dense_tokens: dict[int, tuple] = {}  # _dense's totals before the LM head, by tokens
        # per replica: what MFU and MBU divide by
        self.peak_flops = tp * self._gemm_peak
        self.peak_bandwidth = tp * self._bw
        self.weight_bytes_per_gpu = self.shard.weight_bytes()
        self.kv_bytes_per_token = tp * self.shard.kv_bytes_per_token
        self._precompute()

    def _precompute(self) -> None:
        """Per-model constants of the fast paths (see :meth:`price`); None turns a path off."""
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
        # price_decodes (its own lookup order) and decode_flops: integer per-token constants
        run = self._eff.get("attention_decode") or self._eff.get("attention")
        self._run = self._run_bound = None
        if run is not None and kv_elt == int(kv_elt) and qo == int(qo):
            ke, qi, kf = int(kv_elt), int(qo), L * 4 * h * dh
            if kf < _EXACT and L * ke < _EXACT:
                # (every step of a run has decode rows: its per-step host time is host0d)
                self._run = (float(kf), ke, qi, float(L * ke), L, self._peak16, self._bw, l_launch, host0d, host1,
                             run, run.memory, run.measured, {})
                self._run_bound = (max(kf, L * ke), L * qi)

    # -- pricing -------------------------------------------------------------
    # NOTE: price, price_decodes and decode_flops are the simulator's hot path.
    # They inline ShardShape.attention and _roofline for the two attention
    # operators (per-model constants precomputed in _precompute) with every
    # floating-point operation kept in the original order, so results are
    # bit-identical to the plain code (kept as _price_slow / _price_decodes_slow,
    # which also serve breakdowns and profiles the fast path does not cover).
    def price(self, shape: StepShape, breakdown: bool = False) -> StepCost:
        """What one step costs; ``breakdown`` adds per-operator figures (slower)."""
        q, kv = shape.q, shape.kv
        n = q.shape[0]
        if n == 0:
            return _ZERO
        sums = shape.sums
        if sums is not None:  # (the engine's own row sums: the same integers as below)
            T, n_dec, ctx_dec, pairs, pre_kv = _from_sums(n, sums)
            if T == 0:
                return _ZERO
        else:
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
        if breakdown or c is None:
            return self._price_slow(shape, breakdown, T, n, n_dec, ctx_dec, pairs, pre_kv)
        return self._price_fast(c, n, T, n_dec, ctx_dec, pairs, pre_kv, shape.sampled)

    def price_sums(self, n: int, sums: tuple, sampled: int) -> StepCost | None:
        """:meth:`price` of a step given as its row count, its row sums (``StepShape.sums``)
        and its sampled rows, with no arrays; None where only the slow path prices (then
        build the StepShape and call :meth:`price`)."""
        c = self._attn
        if c is None:
            return None
        T, n_dec, ctx_dec, pairs, pre_kv = _from_sums(n, sums)
        if T == 0:
            return _ZERO
        return self._price_fast(c, n, T, n_dec, ctx_dec, pairs, pre_kv, sampled)

    def _price_fast(self, c: tuple, n: int, T: int, n_dec: int, ctx_dec: int, pairs: float, pre_kv,
                    sampled: int) -> StepCost:
        """:meth:`price`'s fast path from the step's reductions."""
        (L, L4, h, dh, kv_elt, qo, peak, bw, l_launch, host0, host1, host0d,
         pre_eff, pre_mem, pre_range, pre_den, dec_eff, dec_mem, dec_range, dec_den) = c
        hit = self._dense_cache.get((T, sampled))
        if hit is None:
            hit = self._dense(T, sampled)
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
                    pairs: float, pre_kv: float) -> StepCost:
        """:meth:`price` from the row sums, through :class:`Work` items (breakdowns, uncommon profiles)."""
        pre, dcd = self.shard.attention(T - n_dec, pairs, pre_kv, n_dec, ctx_dec)
        host = self._host[2 if n_dec else 0] + self._host[1] * n
        if breakdown:
            return self._priced_breakdown(T, shape.sampled, pre, dcd, host)
        comp, mem, net, over, flops, nbytes, oor = self._dense(T, shape.sampled)
        for w in (pre, dcd):
            if w is not None:
                tc, tm, o = self._roofline(w)
                if tc >= tm:
                    comp += tc
                else:
                    mem += tm
                over += w.kernels * self._launch
                flops += w.flops
                nbytes += w.bytes
                oor += o
        over += host
        t = self.tp
        return StepCost(seconds=comp + mem + net + over, flops=flops * t, bytes=nbytes * t, compute_s=comp,
                        memory_s=mem, network_s=net, overhead_s=over, out_of_range=oor)

    def price_decodes(self, rows: int, context: int, count: int, stride: int, sampled: int) -> DecodeRun:
        """Price ``count`` all-decode steps at once, exactly as :meth:`price` would one by one.

        Every step has ``rows`` rows of one new token each, all with ``kv > 0``;
        step ``j``'s rows hold ``context + j * stride`` cached tokens in all
        (``stride`` is ``rows`` when every row grows by one token per step).
        This is the engine's fast-forward: the arithmetic is :meth:`price`'s,
        operation for operation, on arrays (IEEE-exact for + - * /), and the
        efficiency curves are evaluated with the same scalar code, so element
        ``j`` equals ``price`` of that step bit for bit (tests check it).
        """
        if rows < 1 or count < 1:
            raise ValueError(f"price_decodes needs rows >= 1 and count >= 1, got {rows}, {count}")
        ctx = self._decode_ctx(rows, context, count, stride)
        if ctx is None:
            return self._price_decodes_slow(rows, context, count, stride, sampled)
        c = self._run
        flops_k, ke, qo, lke, L, peak, bw, l_launch, host0d, host1, eff, mem_curve, rng, den_cache = c
        # NOTE: _decode_ctx checked that every step's FLOPs and bytes are
        # integers below 2**53, where float products and sums are exact in any
        # order: fewer array operations than price's formulas, the same doubles.
        w_flops = ctx * flops_k  # L * 4.0 * ctx * heads * head_dim
        w_bytes = ctx * lke  # L * (ctx * kv_elt + rows * qo)
        w_bytes += float(L * rows * qo)
        # w_bytes / L, the bytes per kernel: an arithmetic progression of integers
        b0, step = (context + rows) * ke + rows * qo, stride * ke
        per_bytes = range(b0, b0 + step * count, step) if step else [b0] * count
        mem_eff = mem_curve.progression(context + rows, stride, count, ke, rows * qo)  # (per_bytes's values)
        tc = w_flops / (den_cache.get(rows) or _denominator(den_cache, rows, eff, peak))
        mem_eff *= bw
        tm = w_bytes / mem_eff
        comp, mem, net, over, flops, nbytes, oor0 = self._dense(rows, sampled)
        cbound = tc >= tm
        n_c = int(_nonzero(cbound))
        if n_c == 0:
            comp_s = np.full(count, comp)
            tm += mem
            mem_s = tm
            seconds = comp + mem_s
        elif n_c == count:
            tc += comp
            comp_s = tc
            mem_s = np.full(count, mem)
            seconds = comp_s + mem
        else:
            comp_s = np.where(cbound, comp + tc, comp)
            mem_s = np.where(cbound, mem, mem + tm)
            seconds = comp_s + mem_s
        over = over + l_launch
        over += host0d + host1 * rows
        if net:  # NOTE: x + 0.0 == x bit for bit unless x is -0.0, which a sum of times never is
            seconds += net
        seconds += over
        self._add_dense(w_flops, w_bytes, flops, nbytes)
        if rng is None:
            oor = np.full(count, oor0, dtype=np.int64)
        elif not rng[0] <= rows <= rng[1]:
            oor = np.full(count, oor0 + 1, dtype=np.int64)
        else:  # per_bytes ascends: in range on one slice of steps
            oor = np.full(count, oor0 + 1, dtype=np.int64)
            i = bisect_left(per_bytes, rng[2])
            oor[i:bisect_right(per_bytes, rng[3], i)] = oor0
        return DecodeRun(seconds=seconds, flops=w_flops, bytes=w_bytes, compute_s=comp_s, memory_s=mem_s,
                         network_s=net, overhead_s=over, out_of_range=oor)

    def price_decode_segments(self, segments: list[tuple[int, int, int]]):
        """:meth:`price_decodes` of consecutive stretches of decode steps, in one call.

        ``segments`` are ``(rows, context, count)``: ``count`` steps of ``rows``
        one-token rows (each sampled) over ``context`` cached tokens in all in
        the first, every row one token longer each step (a cohort whose members
        finish between stretches: ``Replica._cohort_run``). Returns one
        :class:`DecodeRun` over all the steps, with ``network_s`` and
        ``overhead_s`` per step (arrays). Element for element the operations of
        :meth:`price_decodes` with each stretch's constants, so the same doubles.
        """
        if len(segments) == 1:
            r, c, n = segments[0]
            return self.price_decodes(r, c, n, r, r)
        if any(not self._exact_run(r, c, n, r) or r < 1 or n < 1 for r, c, n in segments):
            parts = [self.price_decodes(r, c, n, r, r) for r, c, n in segments]
            counts = [len(p.seconds) for p in parts]
            cat = np.concatenate
            return DecodeRun(
                seconds=cat([p.seconds for p in parts]), flops=cat([p.flops for p in parts]),
                bytes=cat([p.bytes for p in parts]), compute_s=cat([p.compute_s for p in parts]),
                memory_s=cat([p.memory_s for p in parts]),
                network_s=np.repeat([p.network_s for p in parts], counts),
                overhead_s=np.repeat([p.overhead_s for p in parts], counts),
                out_of_range=cat([p.out_of_range for p in parts]))
        flops_k, ke, qo, lke, L, peak, bw, l_launch, host0d, host1, eff, mem_curve, rng, den_cache = self._run
        # per stretch: its constants as columns, then one repeat per dtype to steps
        ints, floats, counts = [], [], []
        for r, c, n in segments:
            comp, mem, net, over, flops, nbytes, oor0 = self._dense(r, r)
            over = over + l_launch
            over += host0d + host1 * r
            den = den_cache.get(r) or _denominator(den_cache, r, eff, peak)
            ints.append((r, c + r, oor0))
            floats.append((float(L * r * qo), den, comp, mem, net, over, flops, nbytes))
            counts.append(n)
        total = sum(counts)
        r_step, first, oor = np.repeat(np.array(ints, dtype=np.int64), counts, axis=0).T
        lq, den, comp, mem, net, over_s, flops, nbytes = np.repeat(np.array(floats), counts, axis=0).T
        # each step's sum of (kv + 1): its stretch's first plus rows per step since the stretch began
        at = np.repeat(np.cumsum(counts) - counts, counts)
        ctx = r_step * (np.arange(total) - at)
        ctx += first
        w_flops = ctx * flops_k
        w_bytes = ctx * lke
        w_bytes += lq
        per_bytes = ctx * ke + r_step * qo  # (integers, price_decodes's progressions)
        mem_eff = _array(mem_curve.many(per_bytes.tolist()), dtype=np.float64)
        tc = w_flops / den
        mem_eff *= bw
        tm = w_bytes / mem_eff
        cbound = tc >= tm
        comp_s = np.where(cbound, comp + tc, comp)
        mem_s = np.where(cbound, mem, mem + tm)
        seconds = comp_s + mem_s
        if net.any():  # NOTE: x + 0.0 == x bit for bit unless x is -0.0, which a sum of times never is
            seconds += net
        seconds += over_s
        self._add_dense(w_flops, w_bytes, flops, nbytes)
        if rng is not None:
            oor += (r_step < rng[0]) | (r_step > rng[1]) | (per_bytes < rng[2]) | (per_bytes > rng[3])
        return DecodeRun(seconds=seconds, flops=w_flops, bytes=w_bytes, compute_s=comp_s, memory_s=mem_s,
                         network_s=net, overhead_s=over_s, out_of_range=oor)

    def _add_dense(self, w_flops: np.ndarray, w_bytes: np.ndarray, flops, nbytes) -> None:
        """In place: a run's attention FLOPs and bytes per step plus the dense operators'
        (``flops``, ``nbytes``), then times the TP degree (per replica, all shards)."""
        w_flops += flops
        w_bytes += nbytes
        t = self.tp
        if t != 1:
            w_flops *= t
            w_bytes *= t

    def _price_decodes_slow(self, rows: int, context: int, count: int, stride: int, sampled: int) -> DecodeRun:
        """:meth:`price_decodes` with :meth:`price`'s formulas on arrays (any inputs and profiles)."""
        ctx, w_flops = self._decode_attention_flops_slow(rows, context, count, stride)
        m, sh = self.model, self.shard
        L = m.num_hidden_layers
        kv_elt = 2 * sh.kv_heads * m.head_dim * sh.b_kv
        qo = sh.heads * m.head_dim * B_ACT * 2
        w_bytes = L * (ctx * kv_elt + rows * qo)
        eff = self._eff.get("attention_decode") or self._eff["attention"]
        per_bytes = w_bytes / L
        mem_eff = np.array(eff.memory.many(per_bytes.tolist()), dtype=np.float64)
        tc = w_flops / (self._peak16 * eff.compute(rows))
        tm = w_bytes / (self._bw * mem_eff)
        oor = eff.out_of_range_many(rows, per_bytes)
        comp, mem, net, over, flops, nbytes, oor0 = self._dense(rows, sampled)
        cbound = tc >= tm
        comp_s = np.where(cbound, comp + tc, comp)
        mem_s = np.where(cbound, mem, mem + tm)
        over = over + L * self._launch
        over += self._host[2] + self._host[1] * rows
        t = self.tp
        return DecodeRun(seconds=comp_s + mem_s + net + over, flops=(flops + w_flops) * t,
                         bytes=(nbytes + w_bytes) * t, compute_s=comp_s, memory_s=mem_s,
                         network_s=net, overhead_s=over, out_of_range=oor0 + oor)

    def decode_flops(self, rows: int, context: int, count: int, stride: int, sampled: int) -> np.ndarray:
        """Just the ``flops`` of :meth:`price_decodes` (no efficiency curves: cheap)."""
        _, w_flops = self._decode_attention_flops(rows, context, count, stride)
        w_flops += self._dense(rows, sampled)[4]
        if self.tp != 1:
            w_flops *= self.tp
        return w_flops

    def _decode_attention_flops(self, rows: int, context: int, count: int, stride: int):
        """Per step of a decode run: the sum of (kv + 1) over rows, and decode
        attention's FLOPs with :meth:`ShardShape.attention`'s operation order."""
        ctx = self._decode_ctx(rows, context, count, stride)
        if ctx is None:
            return self._decode_attention_flops_slow(rows, context, count, stride)
        return ctx, ctx * self._run[0]  # exact: see _decode_ctx

    def _decode_ctx(self, rows: int, context: int, count: int, stride: int) -> np.ndarray | None:
        """``context + rows + stride * arange(count)``, or None where a run's FLOPs or
        bytes might not be integers below 2**53 (the fast path's exactness condition)."""
        if not self._exact_run(rows, context, count, stride):
            return None
        first = context + rows
        last = first + stride * (count - 1)
        if stride:
            return _arange(first, last + stride, stride, dtype=np.int64)
        return np.full(count, first, dtype=np.int64)

    def _exact_run(self, rows: int, context: int, count: int, stride: int) -> bool:
        """Whether the fast path prices this run: every step's FLOPs and bytes are
        integers below 2**53 (exact as doubles in any order of operations)."""
        bound = self._run_bound
        if bound is None or type(context) is not int or type(rows) is not int or type(stride) is not int:
            return False
        first = context + rows
        last = first + stride * (count - 1)
        return first >= 1 and stride >= 0 and last * bound[0] + rows * bound[1] < _EXACT

    def _decode_attention_flops_slow(self, rows: int, context: int, count: int, stride: int):
        ctx = context + rows + stride * np.arange(count, dtype=np.int64)
        m, sh = self.model, self.shard
        return ctx, m.num_hidden_layers * 4.0 * ctx * sh.heads * m.head_dim

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
                           max_num_seqs: int = 256) -> int:
        """Tokens of KV cache one replica holds (every shard holds the same tokens).

        (memory x utilization - weights/tp - runtime reserve - activations) /
        KV bytes per token, per GPU. Raises InputError when nothing is left.
        """
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise InputError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        hw, gib = self.hardware, 2.0**30
        usable = hw.memory_bytes * gpu_memory_utilization
        reserve = hw.memory_reserve_gib * gib
        act = self.shard.activation_bytes(max_num_batched_tokens, max_num_seqs)
        free = usable - self.weight_bytes_per_gpu - reserve - act
        per_token = self.shard.kv_bytes_per_token
        if free < per_token:
            raise InputError(
                f"{self.model.name} ({self.dtype}) does not fit on {hw.name} at tp={self.tp}: "
                f"{gpu_memory_utilization:g} x {hw.memory_gib:g} GiB = {usable / gib:.1f} GiB per GPU, but weights "
                f"take {self.weight_bytes_per_gpu / gib:.1f} GiB, runtime reserve {reserve / gib:.1f} GiB and "
                f"activations {act / gib:.1f} GiB, leaving {free / gib:.1f} GiB for the KV cache; "
                f"raise --tp or use a smaller dtype")
        return int(free // per_token)

    def kv_capacity_blocks(self, gpu_memory_utilization: float, block_size: int = 16, **kw: int) -> int:
        """KV capacity in paged blocks of ``block_size`` tokens."""
        return self.kv_capacity_tokens(gpu_memory_utilization, **kw) // block_size
