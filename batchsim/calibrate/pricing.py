"""The roofline model's fast path as a table of named numbers: what the compiled core prices from.

:meth:`batchsim.calibrate.costmodel.RooflineCostModel.pricing_table` builds a
:class:`PricingTable` from the model, the device profile and the parallelism:
every constant :meth:`~batchsim.calibrate.costmodel.RooflineCostModel.price` uses for a
step's attention, dense operators, launches, host overhead and all-reduces,
by name. It is the one way the compiled core (batchsim/core/__init__.py, batchsim/core/_core.c) gets
the cost model's parameters; the formulas themselves are the cost model's
(batchsim/calibrate/work.py, batchsim/calibrate/costmodel.py), which the core executes as well
(batchsim/core/rules.py keeps the two in step).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CurveTable", "OperatorTable", "DenseTable", "PricingTable"]


@dataclass(frozen=True)
class CurveTable:
    """An efficiency curve (batchsim.calibrate.curves.Curve): a piecewise power law, clamped.

    ``fraction(size)`` is ``y_lo`` at or below ``lo``, ``y_hi`` at or above
    ``hi``, else ``exp(log_y[i] + (log(size) - log_x[i]) * slope[i])`` for the
    segment ``i`` holding ``log(size)``.
    """

    log_x: tuple[float, ...]
    log_y: tuple[float, ...]
    slope: tuple[float, ...]
    lo: float
    hi: float
    y_lo: float
    y_hi: float


@dataclass(frozen=True)
class OperatorTable:
    """One operator's roofline constants: ``max(flops / (peak * compute(tokens)),
    bytes / (bandwidth * memory(bytes per kernel)))``, plus ``kernels`` launches."""

    name: str
    op_class: str
    kernels: int
    peak_flops: float  # FLOP/s per GPU for this operator's dtype
    compute: CurveTable
    memory: CurveTable
    measured: tuple[float, float, float, float] | None  # (tokens lo, hi, bytes lo, hi); None: never out of range


@dataclass(frozen=True)
class DenseTable:
    """The non-attention operators of a dense (non-MoE) model, per GPU shard."""

    hidden_size: int
    q_heads: int
    kv_heads: int
    qkv_width: int
    rotary_width: int
    vocab: int  # per shard
    mlp_width: int  # per shard
    mlp_up_width: int  # gate+up for gated MLPs
    weight_bytes: float  # bytes per weight element
    kv_bytes: float  # bytes per KV element
    launch_s: float  # one kernel launch
    link_latency_s: float
    link_bandwidth: float  # bytes/s, efficiency applied
    operators: tuple[OperatorTable, ...]  # batchsim.calibrate.work.ShardShape.dense's order, then the LM head


@dataclass(frozen=True)
class PricingTable:
    """Everything :meth:`RooflineCostModel.price`'s fast path reads, by name."""

    layers: int
    q_heads: int  # per shard
    head_dim: int
    tp: int
    kv_bytes_per_token_layer: float  # K and V of one token in one layer, per shard
    qo_bytes_per_token_layer: float  # Q read and O written per token and layer
    attention_peak_flops: float
    bandwidth: float  # HBM bytes/s per GPU
    attention_launch_s: float  # launches of one attention part over all layers
    host_step_s: float
    host_seq_s: float
    host_decode_step_s: float  # per step with decode rows (per step + the decode extra)
    prefill: OperatorTable
    decode: OperatorTable
    dense: DenseTable | None  # None: the core asks Python for the dense totals (MoE models)
