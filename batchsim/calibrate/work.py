"""How much work each operator does: FLOPs and bytes per tensor-parallel shard.

:class:`ShardShape` holds one shard's slice of the model (heads, MLP width,
vocabulary) and the element sizes, and turns a step's token counts into
:class:`Work` items, each summed over all layers of that shard. The formulas
are the table in docs/cost-model.md ("Cost-model arithmetic" in DESIGN.md),
with notation d = hidden, L = layers, d_h = head dim, h_s / k_s = query / KV
heads on this shard, f_s = MLP width on this shard, b_w / b_kv / b_a = bytes
per weight / KV element / activation.

Time is not computed here: the cost model prices each item with the
hardware profile. Keeping work and time apart is what lets tests check FLOPs
and bytes by hand independently of any efficiency curve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from batchsim.calibrate.models import DTYPE_BYTES, ModelSpec
from batchsim.sim.errors import InputError

__all__ = ["Work", "ShardShape"]

B_ACT = 2.0  # activations are bf16/fp16 whatever the weight dtype


class Work(NamedTuple):
    """One operator's work on one shard, summed over all its kernels (layers)."""

    name: str
    op_class: str  # efficiency class in the hardware profile
    kernels: int  # launches; the roofline is applied per kernel (flops/kernels, bytes/kernels)
    flops: float
    bytes: float
    tokens: float  # size that indexes the compute-efficiency curve (GEMM M)


@dataclass(frozen=True)
class ShardShape:
    """One tensor-parallel shard of a model with its element sizes."""

    model: ModelSpec
    tp: int
    b_w: float
    b_kv: float

    @classmethod
    def of(cls, model: ModelSpec, tp: int, dtype: str, kv_dtype: str) -> "ShardShape":
        """Validate that ``tp`` divides the model and build the shard."""
        h, hk, f = model.num_attention_heads, model.num_key_value_heads, model.intermediate_size
        where = f"--tp {tp} for {model.name}"
        if h % tp:
            raise InputError(f"num_attention_heads ({h}) is not divisible by tp={tp}", where=where)
        if hk % tp and tp % hk:
            raise InputError(f"num_key_value_heads ({hk}) and tp={tp} must divide one another", where=where)
        width = model.expert_intermediate_size if model.is_moe else f
        if width % tp:
            raise InputError(f"MLP width ({width}) is not divisible by tp={tp}", where=where)
        return cls(model, tp, DTYPE_BYTES[dtype], DTYPE_BYTES[kv_dtype])

    # -- per-shard dimensions ------------------------------------------------
    @property
    def heads(self) -> int:
        """Query heads on this shard."""
        return self.model.num_attention_heads // self.tp

    @property
    def kv_heads(self) -> int:
        """KV heads on this shard (replicated when tp exceeds the KV head count, as vLLM does)."""
        return max(1, self.model.num_key_value_heads // self.tp)

    @property
    def qkv_width(self) -> int:
        """Output width of the fused QKV projection on this shard."""
        return (self.heads + 2 * self.kv_heads) * self.model.head_dim

    @property
    def vocab(self) -> int:
        """Vocabulary rows on this shard (vocab-parallel embedding / LM head)."""
        return -(-self.model.vocab_size // self.tp)

    @property
    def mlp_width(self) -> int:
        """Dense MLP (or one expert's) intermediate width on this shard."""
        m = self.model
        return (m.expert_intermediate_size if m.is_moe else m.intermediate_size) // self.tp

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token occupies on this shard (all layers)."""
        m = self.model
        return m.num_hidden_layers * 2 * self.kv_heads * m.head_dim * self.b_kv

    def weight_bytes(self) -> float:
        """Bytes of weights this shard holds (embedding and LM head kept in 16 bits)."""
        m, L, d = self.model, self.model.num_hidden_layers, self.model.hidden_size
        mats = 3 if m.mlp_gated else 2
        attn = d * self.qkv_width + self.heads * m.head_dim * d
        experts = max(1, m.num_local_experts)
        mlp = experts * mats * d * self.mlp_width
        layer = (attn + mlp) * self.b_w
        layer += B_ACT * (2 * d + (self.qkv_width if m.attention_bias else 0) + d * m.num_local_experts)
        emb = self.vocab * d * B_ACT * (1 if m.tie_word_embeddings else 2)
        return L * layer + emb + d * B_ACT

    def touched_experts(self, tokens: int) -> float:
        """Expected distinct experts hit by ``tokens`` tokens under uniform top-k routing."""
        m = self.model
        e, k = m.num_local_experts, m.num_experts_per_tok
        return e * (1.0 - (1.0 - k / e) ** tokens)

    # -- work ----------------------------------------------------------------
    def gemm(self, name: str, kernels: int, m: float, k: float, n: float, weights: float | None = None) -> Work:
        """``kernels`` GEMMs of (m x k) @ (k x n); ``weights`` overrides the k*n*b_w weight bytes."""
        w = k * n * self.b_w if weights is None else weights
        return Work(name, "gemm", kernels, kernels * 2.0 * m * k * n,
                    kernels * (w + (m * k + m * n) * B_ACT), m)

    def dense(self, tokens: int, sampled: int) -> list[Work]:
        """Everything but attention and communication for a step of ``tokens`` tokens."""
        m, T = self.model, float(tokens)
        L, d, dh = m.num_hidden_layers, m.hidden_size, m.head_dim
        rot = (self.heads + self.kv_heads) * dh
        out = [
            Work("embedding", "elementwise", 1, 0.0, T * d * B_ACT * 2 + T * 4, T),
            # fused residual-add + RMSNorm: read x and residual, write both; 2 per layer + final
            Work("norms", "elementwise", 2 * L + 1, (2 * L + 1) * 5 * T * d, (2 * L + 1) * 4 * T * d * B_ACT, T),
            self.gemm("qkv_proj", L, T, d, self.qkv_width),
            Work("rotary", "elementwise", L, L * 3 * T * rot, L * 2 * T * rot * B_ACT, T),
            Work("kv_cache_write", "elementwise", L, 0.0,
                 L * T * 2 * self.kv_heads * dh * (B_ACT + self.b_kv), T),
            self.gemm("o_proj", L, T, self.heads * dh, d),
        ]
        out += self._moe(tokens) if m.is_moe else self._mlp(T)
        if sampled > 0:
            out.append(self.lm_head(sampled))
        return out

    def lm_head(self, sampled: int) -> Work:
        """The LM head over ``sampled`` rows (last in :meth:`dense`), fp32 logits written."""
        S, d = float(sampled), self.model.hidden_size
        lm = self.gemm("lm_head", 1, S, d, self.vocab, weights=d * self.vocab * B_ACT)
        return lm._replace(bytes=lm.bytes + S * self.vocab * (4 - B_ACT))

    def _mlp(self, T: float) -> list[Work]:
        m = self.model
        L, d, f = m.num_hidden_layers, m.hidden_size, self.mlp_width
        up = 2 * f if m.mlp_gated else f
        return [
            self.gemm("mlp_gate_up" if m.mlp_gated else "mlp_up", L, T, d, up),
            Work("mlp_act", "elementwise", L, L * 5 * T * f, L * T * (up + f) * B_ACT, T),
            self.gemm("mlp_down", L, T, f, d),
        ]

    def _moe(self, tokens: int) -> list[Work]:
        m = self.model
        L, d, f, k, E = m.num_hidden_layers, m.hidden_size, self.mlp_width, m.num_experts_per_tok, m.num_local_experts
        T = float(tokens)
        touched = self.touched_experts(tokens)
        rows = T * k  # token-expert pairs
        per_expert = rows / touched if touched else 0.0  # the GEMM M each expert sees
        up = 2 * f if m.mlp_gated else f

        def experts(name: str, kk: int, nn: int) -> Work:
            flops = L * 2.0 * rows * kk * nn
            nbytes = L * (touched * kk * nn * self.b_w + rows * (kk + nn) * B_ACT)
            return Work(name, "gemm", L, flops, nbytes, per_expert)

        router = self.gemm("moe_router", L, T, d, E, weights=d * E * B_ACT)
        return [
            router._replace(bytes=router.bytes + L * T * E * (4 - B_ACT)),
            experts("moe_gate_up", d, up),
            Work("moe_act", "elementwise", L, L * 5 * rows * f, L * rows * (up + f) * B_ACT, rows),
            experts("moe_down", f, d),
        ]

    def attention(self, prefill_tokens: int, pairs: float, prefill_kv: float,
                  decodes: int, decode_ctx: float) -> tuple[Work | None, Work | None]:
        """Prefill (causal, flash-style: KV read once) and decode (KV read) attention work.

        ``pairs`` = sum over prefill rows of q*(kv + (q+1)/2); ``prefill_kv`` =
        sum of (kv + q) over prefill rows; ``decode_ctx`` = sum of (kv + 1)
        over decode rows.
        """
        m = self.model
        L, dh = m.num_hidden_layers, m.head_dim
        h, k = self.heads, self.kv_heads
        kv_elt = 2 * k * dh * self.b_kv  # K and V of one token on this shard
        qo = h * dh * B_ACT * 2  # read Q, write O, per query token
        pre = dec = None
        if prefill_tokens:
            pre = Work("attention", "attention_prefill", L, L * 4.0 * pairs * h * dh,
                       L * (prefill_kv * kv_elt + prefill_tokens * qo), prefill_tokens)
        if decodes:
            dec = Work("attention", "attention_decode", L, L * 4.0 * decode_ctx * h * dh,
                       L * (decode_ctx * kv_elt + decodes * qo), decodes)
        return pre, dec

    def allreduce_bytes(self, tokens: int) -> float:
        """Bytes one all-reduce sends per GPU (ring: 2(t-1)/t of the message)."""
        msg = tokens * self.model.hidden_size * B_ACT
        return 2.0 * (self.tp - 1) / self.tp * msg

    def activation_bytes(self, tokens: int, seqs: int) -> float:
        """Peak transient activation memory of a forward pass over ``tokens`` tokens (estimate)."""
        m = self.model
        d, f = m.hidden_size, self.mlp_width
        width = (3 * f) * (m.num_experts_per_tok if m.is_moe else 1)
        per_token = (2 * d + self.qkv_width + width) * B_ACT
        return tokens * per_token + seqs * self.vocab * 4.0
