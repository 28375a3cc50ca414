"""Fitting a hardware profile's efficiency curves to timed kernels (no torch here).

A calibration runs the reference executor's model over a plan of steps
(:func:`plan_steps`: decode batches over contexts, prefills over a token
grid, chunks over a cached context) and times every kernel where it runs.
Each kernel of each step becomes a :class:`Sample` whose FLOPs and bytes come
from :class:`batchsim.calibrate.work.ShardShape`, the same formulas the cost model
prices with, so a fitted curve means exactly what the pricing code reads.

Per operator class (not per model: one calibration serves every model on a
device) :func:`fit_class` fits the ``compute`` curve (fraction of peak FLOP/s
by tokens) and the ``memory`` curve (fraction of peak bandwidth by bytes per
kernel) so that ``max(flops / (P e_c), bytes / (W e_m)) + launch`` matches the
measured times, by least absolute log error. Each elementwise operator also
gets its own curves (see :mod:`batchsim.calibrate.hardware`). Held-out cases (every
other size, and one GEMM shape entirely) never enter the fit and give
:func:`held_out_error`. :func:`fit_host` then fits the per-step and
per-sequence host overhead to whole-model step times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from batchsim.calibrate.curves import ClassEfficiency
from batchsim.calibrate.hardware import OP_CLASSES, Efficiency, HardwareProfile, HostOverhead, MeasuredRange
from batchsim.calibrate.models import ModelSpec
from batchsim.calibrate.work import ShardShape, Work
from batchsim.sim.types import StepShape

__all__ = ["Case", "Sample", "GEMMS", "ELEMENTWISE", "HELD_OUT_GEMM", "PRESETS", "plan_steps", "step_works",
           "step_size", "samples_of", "fit_class", "fit_efficiency", "predict_seconds", "held_out_error", "fit_host"]

GEMMS = ("qkv_proj", "o_proj", "mlp_gate_up", "mlp_down", "lm_head")
ELEMENTWISE = ("embedding", "norms", "rotary", "kv_cache_write", "mlp_act")
HELD_OUT_GEMM = "o_proj"  # never fitted: shows the GEMM curves carry over to an unseen weight shape


@dataclass(frozen=True)
class Case:
    """One kernel of one calibration step of one model."""

    model: str
    kernel: str  # a GEMMS or ELEMENTWISE name, "attention_prefill" or "attention_decode"
    size: tuple[int, int, int]  # the step: (rows, tokens, longest context)
    held_out: bool


@dataclass(frozen=True)
class Sample:
    """A timed kernel with its work, per launch."""

    case: Case
    op_class: str
    flops: float
    bytes: float
    tokens: float
    seconds: float


def _grid(top: int) -> list[tuple[int, bool]]:
    """Sizes 1..top about sqrt(2) apart, each with held_out = odd grid index.

    NOTE: ``round(1.1 * 2^(k/2))``, not powers of two: CPU SDPA and oneDNN run
    powers of two faster than their neighbours, and the executor's sizes are
    arbitrary, so a grid of powers of two would bias every curve fast.
    """
    out: dict[int, bool] = {}
    k = 0
    while (n := int(round(1.1 * 2 ** (k / 2)))) <= top:
        out.setdefault(n, bool(k % 2))
        k += 1
    return sorted(out.items())


# (longest prefill swept for the GEMM and elementwise token grid, longest chunk over a cached
# context, largest decode batch, decode contexts) per (device kind, quick)
PRESETS = {("cpu", True): (2048, 512, 32, (16, 128, 512)),
           ("cpu", False): (4096, 1024, 128, (16, 64, 256, 1024)),
           ("cuda", True): (4096, 1024, 64, (128, 1024)),
           ("cuda", False): (16384, 2048, 128, (128, 512, 2048))}


def plan_steps(kind: str, quick: bool) -> list[tuple[StepShape, bool]]:
    """The steps a calibration times, each with its held-out flag, ordered by KV need.

    Decode batches over contexts (decode attention; GEMMs and elementwise at
    small token counts), single prefills over the token grid (GEMMs,
    elementwise, causal attention), chunks over a cached context (attention
    with a KV prefix) and batches of 4 equal prompts (a padded batch's prefill).
    """
    tokens_top, chunk_top, batch_top, kvs = PRESETS[(kind, quick)]
    steps = [(StepShape.of([(1, kv)] * b), held) for b, held in _grid(batch_top) for kv in kvs]
    for q, held in _grid(chunk_top):
        steps += [(StepShape.of([(q, kv)]), held) for kv in (q, 3 * q)]
        if q <= 256:
            steps.append((StepShape.of([(q, 0)] * 4), held))
    steps += [(StepShape.of([(q, 0)]), held) for q, held in _grid(tokens_top)]
    return sorted(steps, key=lambda s: (int((s[0].q + s[0].kv).max()), s[0].num_rows))


def _per_kernel(w: Work) -> Work:
    return w._replace(flops=w.flops / w.kernels, bytes=w.bytes / w.kernels, kernels=1)


def step_works(model: ModelSpec, shape: StepShape, dtype: str = "bf16") -> dict[str, Work]:
    """The cost model's work of each kernel of one step, per launch, by operator name.

    Attention is split as :meth:`batchsim.calibrate.costmodel.RooflineCostModel.price`
    splits it: decode rows (q = 1, kv > 0) and everything else (prefill).
    """
    shard = ShardShape.of(model, 1, dtype, dtype)
    q, kv = shape.q, shape.kv
    works = {w.name: _per_kernel(w) for w in shard.dense(shape.num_tokens, shape.sampled)}
    dec = (q == 1) & (kv > 0)
    pq, pkv = q[~dec], kv[~dec]
    pairs = float((pq * (pkv + (pq + 1) / 2.0)).sum())
    pre, dcd = shard.attention(int(pq.sum()), pairs, float((pkv + pq).sum()), int(dec.sum()),
                               float((kv[dec] + 1).sum()))
    for name, w in (("attention_prefill", pre), ("attention_decode", dcd)):
        if w is not None:
            works[name] = _per_kernel(w)
    return works


def step_size(shape: StepShape) -> tuple[int, int, int]:
    """A calibration step's size as its samples and evidence record it: (rows, tokens, longest context)."""
    return shape.num_rows, shape.num_tokens, int((shape.q + shape.kv).max())


def samples_of(model: ModelSpec, plan: Sequence[tuple[StepShape, bool]], kernels: Sequence[dict[str, list[float]]],
               dtype: str = "bf16") -> list[Sample]:
    """One sample per kernel and step: the median of its timed calls (all layers, all rounds)."""
    out = []
    for (shape, held), times in zip(plan, kernels):
        works = step_works(model, shape, dtype)
        size = step_size(shape)
        for name, ts in sorted(times.items()):
            w = works[name]
            case = Case(model.name, name, size, held or name == HELD_OUT_GEMM)
            out.append(Sample(case, w.op_class, w.flops, w.bytes, w.tokens, float(np.median(ts))))
    return out


# -- fitting one class ----------------------------------------------------------
# NOTE: a parametric fit, not a free node per size: timings on a shared machine are noisy
# (2x between neighbours' bursts), and free nodes chase that noise (held-out errors of
# several x in a first attempt). Five parameters per class give smooth, monotone curves:
#   e_c(T) = c_max / (1 + (T0 / T)^a)      compute: saturates with the tokens
#   e_m(B) = m_max / (1 + B0 / B)          memory: time = (B + B0) / (W m_max), a floor plus a rate
_LO = math.log(1e-7)


def _curves(theta: np.ndarray, lt: np.ndarray, lb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log e_c at log tokens ``lt`` and log e_m at log bytes ``lb`` (natural logs)."""
    lc_max, lt0, la, lm_max, lb0 = theta
    lc = lc_max - np.logaddexp(0.0, math.exp(la) * (lt0 - lt))
    lm = lm_max - np.logaddexp(0.0, lb0 - lb)
    return lc, lm


def _loss(theta: np.ndarray, lt, lb, lc_hat, lm_hat) -> float:
    lc, lm = _curves(theta, lt, lb)
    return float(np.abs(np.maximum(lc_hat - lc, lm_hat - lm)).mean())


def _descend(theta: np.ndarray, args: tuple, sweeps: int = 60) -> tuple[np.ndarray, float]:
    """Coordinate descent with shrinking steps; fractions stay <= 1."""
    best = _loss(theta, *args)
    for step in (2.0, 1.0, 0.5, 0.25, 0.12, 0.06, 0.03, 0.015, 0.007, 0.003):
        for _ in range(sweeps):
            improved = False
            for j in range(len(theta)):
                for delta in (-step, step):
                    trial = theta.copy()
                    trial[j] += delta
                    trial[0], trial[3] = min(trial[0], 0.0), min(trial[3], 0.0)
                    trial[2] = min(max(trial[2], math.log(0.2)), math.log(3.0))
                    loss = _loss(trial, *args)
                    if loss < best - 1e-12:
                        theta, best, improved = trial, loss, True
            if not improved:
                break
    return theta, best


def fit_class(samples: Sequence[Sample], peak_flops: float, bandwidth: float, launch_s: float) -> Efficiency:
    """Compute and memory curves for one operator class, fitted to its training samples."""
    train = [s for s in samples if not s.case.held_out] or list(samples)
    t = np.array([max(s.seconds - launch_s, 0.05 * s.seconds) for s in train])
    flops = np.array([s.flops for s in train])
    nbytes = np.array([max(s.bytes, 1.0) for s in train])
    lt = np.log(np.array([max(s.tokens, 1.0) for s in train]))
    lb = np.log(nbytes)
    with np.errstate(divide="ignore"):
        lc_hat = np.where(flops > 0, np.log(flops / (peak_flops * t)), -np.inf)
    lm_hat = np.log(nbytes / (bandwidth * t))
    args = (lt, lb, lc_hat, lm_hat)
    has_c = bool(np.isfinite(lc_hat).any())
    c0 = min(float(lc_hat[np.isfinite(lc_hat)].max()), 0.0) if has_c else 0.0
    best = (math.inf, None)
    for lt0 in np.quantile(lt, [0.25, 0.75]) if has_c else [0.0]:
        for lb0 in np.quantile(lb, [0.25, 0.75]):
            theta0 = np.array([c0, lt0, 0.0, min(float(lm_hat.max()), 0.0), lb0])
            theta, loss = _descend(theta0, args)
            if loss < best[0]:
                best = (loss, theta)
    theta = best[1]
    every_t = [max(s.tokens, 1.0) for s in samples]
    every_b = [max(s.bytes, 1.0) for s in samples]
    tok = _span(min(every_t), max(every_t))
    byt = _span(min(every_b), max(every_b))
    lc, _ = _curves(theta, np.log(tok), np.zeros(1))
    _, lm = _curves(theta, np.zeros(1), np.log(byt))
    compute = list(zip(tok.tolist(), np.exp(lc).tolist())) if has_c else [(1.0, 1.0)]
    rng = MeasuredRange(tokens=(float(min(every_t)), float(max(every_t))),
                        bytes=(float(min(every_b)), float(max(every_b))))
    return Efficiency(compute=_round(compute), memory=_round(list(zip(byt.tolist(), np.exp(lm).tolist()))),
                      measured_range=rng)


def _span(lo: float, hi: float) -> np.ndarray:
    """Powers of two covering [lo, hi] (curve nodes; the curves are clamped beyond)."""
    return 2.0 ** np.arange(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1)


def _round(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(round(x, 3), max(float(f"{y:.4g}"), 1e-7)) for x, y in points]


def fit_efficiency(samples: Sequence[Sample], peak_flops: float, bandwidth: float,
                   launch_s: float) -> dict[str, Efficiency]:
    """:func:`fit_class` for every operator class, and for each elementwise operator on its own."""
    out = {c: fit_class([s for s in samples if s.op_class == c], peak_flops, bandwidth, launch_s)
           for c in OP_CLASSES}
    for op in ELEMENTWISE:
        mine = [s for s in samples if s.case.kernel == op]
        if mine:
            out[op] = fit_class(mine, peak_flops, bandwidth, launch_s)
    return out


# -- predicting and scoring -------------------------------------------------------
def predict_seconds(profile: HardwareProfile, sample: Sample, dtype: str = "bf16") -> float:
    """The cost model's time for one kernel: ``max(compute, memory) + launch``.

    Mirrors :meth:`batchsim.calibrate.costmodel.RooflineCostModel._roofline` for one
    launch, operator curves before class curves (a test checks they agree).
    """
    entry = profile.efficiency.get(sample.case.kernel) or profile.efficiency[sample.op_class]
    eff = ClassEfficiency(entry)
    peak = profile.peak_flops(dtype if sample.op_class == "gemm" else "bf16")
    tc = sample.flops / (peak * eff.compute(sample.tokens)) if sample.flops else 0.0
    tm = sample.bytes / (profile.bandwidth * eff.memory(sample.bytes)) if sample.bytes else 0.0
    return max(tc, tm) + profile.launch_latency_us * 1e-6


def _stats(v: list[float]) -> dict:
    return {"n": len(v), "median": float(np.median(v)) if v else 0.0,
            "p90": float(np.percentile(v, 90)) if v else 0.0}


def held_out_error(profile: HardwareProfile, samples: Iterable[Sample], dtype: str = "bf16") -> dict:
    """|relative error| of the held-out samples: median and p90, overall and per class."""
    errs: dict[str, list[float]] = {}
    for s in samples:
        if s.case.held_out:
            errs.setdefault(s.op_class, []).append(abs(predict_seconds(profile, s, dtype) / s.seconds - 1.0))
    return {"overall": _stats([e for v in errs.values() for e in v]),
            **{c: _stats(v) for c, v in sorted(errs.items())}}


# -- host overhead ------------------------------------------------------------------
def fit_host(shapes: Sequence[StepShape], seconds: Sequence[float], predicted: Sequence[float]) -> HostOverhead:
    """``per_step + per_seq x rows + per_decode_step x [the step has decode rows]`` fitted
    (least absolute error; per_step, per_seq and per_step + per_decode_step >= 0) to the gap
    between measured step times and the kernel-only prediction.

    NOTE: the decode term is there because decode steps' host time differs from the others'.
    An eager decode attention launches several kernels more than a prefill's: on the H200 of
    docs/validation.md decode steps took ~2 ms more host time than prefills of as many rows, and
    one per-step figure split the difference (held-out steps 8.0% -> 6.1% with the term, same
    evidence). Replayed from CUDA graphs (the executor's graph path) decode steps take less
    than eager prefills: the term is then negative.
    """
    rows = np.array([s.num_rows for s in shapes], dtype=float)
    dec = np.array([bool(((s.q == 1) & (s.kv > 0)).any()) for s in shapes], dtype=float)
    gap = np.asarray(seconds, dtype=float) - np.asarray(predicted, dtype=float)
    top = max(float(gap.max()), 0.0)
    best = (np.abs(gap - max(np.median(gap), 0.0)).sum(), max(float(np.median(gap)), 0.0), 0.0, 0.0)
    seq_grid = np.unique(np.concatenate([[0.0], np.linspace(0, top / max(rows.min(), 1), 200)]))
    dec_grid = (np.unique(np.concatenate([[0.0], np.linspace(-top, top, 121)])) if 0 < dec.sum() < len(dec)
                else np.array([0.0]))

    def search(ds, bs, best):
        for d in ds:
            rest = gap - d * dec
            for b in bs:
                r = rest - b * rows
                a = max(float(np.median(r)), 0.0, -float(d))  # (a decode step's own term stays >= 0)
                loss = np.abs(r - a).sum()
                if loss < best[0]:
                    best = (loss, a, float(b), float(d))
        return best

    best = search(dec_grid, seq_grid, best)
    # then a grid of one coarse step either side of the best point, moved with it while it moves
    # (the two terms trade off, decode steps having more rows, so the coarse best can lie in the
    # wrong valley), then 20x finer, twice (per_seq stays >= 0)
    dstep = dec_grid[1] - dec_grid[0] if len(dec_grid) > 1 else 0.0
    bstep = seq_grid[1] - seq_grid[0] if len(seq_grid) > 1 else 0.0
    for _ in range(3):
        for _ in range(100):
            before = best
            best = search(np.linspace(best[3] - dstep, best[3] + dstep, 41) if dstep else np.array([best[3]]),
                          np.unique(np.clip(np.linspace(best[2] - bstep, best[2] + bstep, 41), 0, None)), best)
            if best is before:
                break
        dstep, bstep = dstep / 20, bstep / 20
    step, decode = round(best[1] * 1e6, 2), round(best[3] * 1e6, 2)
    return HostOverhead(per_step_us=step, per_seq_us=round(best[2] * 1e6, 3),
                        per_decode_step_us=max(decode, -step))  # (no rounding below a zero decode step)
