"""Hardware profiles: datasheet peaks, efficiency curves and their provenance.

A profile is one YAML file per device. It holds the dense (not sparse)
datasheet peaks, the interconnect, the launch and host overheads, and one
efficiency entry per operator class:

- ``compute``: ``[[tokens, fraction], ...]``, the achieved fraction of peak
  FLOP/s as a function of the tokens the kernel processes (the GEMM ``M``);
- ``memory``: ``[[bytes, fraction], ...]``, the achieved fraction of peak HBM
  bandwidth as a function of the bytes the kernel moves;
- ``measured_range`` (calibrated profiles): the token and byte ranges the
  curves were fitted on; a prediction outside them is counted, never silent.

A calibrated profile may also key an entry by an operator's name (``norms``,
``rotary``, ...; :data:`OPERATORS`): it then prices that operator instead of
its class's entry. Eager CPU kernels need it: their time per byte differs
several-fold between, say, an embedding gather and an RMSNorm.

Curves are interpolated as power laws between points (linear in log-log)
and clamped at their ends. The
calibration step (``batchsim calibrate``) writes the same schema with
:func:`save_hardware`, so a fitted profile is a drop-in replacement for a
datasheet one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from batchsim.calibrate._io import catalog_names, read_mapping, resolve, validate

__all__ = ["OP_CLASSES", "OPERATORS", "Efficiency", "Interconnect", "HostOverhead", "FrontendOverhead", "HardwareProfile",
           "load_hardware", "hardware_names", "save_hardware"]

PROFILE_DIR = Path(__file__).parent / "profiles"

OP_CLASSES = ("gemm", "attention_prefill", "attention_decode", "elementwise")
OpClass = Literal["gemm", "attention_prefill", "attention_decode", "elementwise"]
# Operator names (batchsim.calibrate.work) that may carry their own curves, overriding their class's.
OPERATORS = ("embedding", "norms", "qkv_proj", "rotary", "kv_cache_write", "o_proj", "mlp_gate_up", "mlp_up",
             "mlp_act", "mlp_down", "moe_router", "moe_gate_up", "moe_act", "moe_down", "lm_head")

Points = list[tuple[float, float]]


def _check_points(points: Points) -> Points:
    if not points:
        raise ValueError("a curve needs at least one [size, fraction] point")
    sizes = [p[0] for p in points]
    if any(s <= 0 for s in sizes):
        raise ValueError("curve sizes must be > 0")
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"curve sizes must be strictly increasing, got {sizes}")
    if any(not 0.0 < p[1] <= 1.0 for p in points):
        raise ValueError(f"curve fractions must be in (0, 1], got {[p[1] for p in points]}")
    return points


class MeasuredRange(BaseModel):
    """Sizes a calibrated curve was fitted on (inclusive)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    tokens: tuple[float, float] | None = None
    bytes: tuple[float, float] | None = None


class Efficiency(BaseModel):
    """Achieved fractions of peak for one operator class."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    compute: Points = Field(description="[[tokens, fraction of peak FLOP/s], ...]")
    memory: Points = Field(description="[[bytes, fraction of peak bandwidth], ...]")
    measured_range: MeasuredRange | None = None

    @field_validator("compute", "memory")
    @classmethod
    def _points(cls, v: Points) -> Points:
        return _check_points(v)


class Interconnect(BaseModel):
    """The tensor-parallel link: per-GPU bandwidth in one direction."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    bandwidth_gbs: float = Field(gt=0, description="GB/s per GPU per direction")
    latency_us: float = Field(ge=0, description="fixed cost of one all-reduce")
    efficiency: float = Field(0.8, gt=0, le=1, description="achieved fraction of bandwidth_gbs")


class HostOverhead(BaseModel):
    """CPU time per step that the GPU waits for (scheduling, input prep, sampling)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    per_step_us: float = Field(ge=0, le=1e9)
    per_seq_us: float = Field(ge=0, le=1e9)
    # NOTE: the difference a step with decode rows makes. More for an eager decode attention, which
    # launches several kernels more than a prefill's (gather, mask, SDPA: on the H200 of
    # docs/validation.md decode steps took ~2 ms more host time); less, down to no host time at all,
    # where decode steps replay CUDA graphs and the others launch eagerly (the reference executor's
    # graph path; vLLM's full graphs for pure decodes and piecewise ones for mixed steps)
    per_decode_step_us: float = Field(0.0, ge=-1e9, le=1e9, description="the difference per step that has decode "
                                      "rows (negative: decode steps take less host time)")
    # NOTE: with TP > 1 the scheduler's output is broadcast to every worker each step (vLLM's
    # shared-memory message queue, SGLang's and TRT-LLM's per-rank executors): time per extra rank.
    per_tp_rank_us: float = Field(0.0, ge=0, le=1e9, description="more per step for each tensor-parallel rank past the first")

    @model_validator(mode="after")
    def _decode_step_not_below_zero(self) -> "HostOverhead":
        if self.per_step_us + self.per_decode_step_us < 0:
            raise ValueError(f"per_step_us + per_decode_step_us must be >= 0 (a decode step's host time), got "
                             f"{self.per_step_us} + {self.per_decode_step_us}")
        return self

    def step_us(self, tp: int) -> float:
        """The per-step term at tensor-parallel size ``tp``."""
        return self.per_step_us + self.per_tp_rank_us * (tp - 1) if self.per_tp_rank_us else self.per_step_us


class FrontendOverhead(BaseModel):
    """The serving frontend's time outside the engine's steps (batchsim.sim.frontend).

    In: a request is received and tokenized by one frontend process, in order of arrival, before
    the engine can queue it (``per_request_us + per_prompt_token_us * prompt``). Out: each step's
    new tokens are detokenized and streamed by that process, in step order, before the client has
    them (``per_step_us + per_output_token_us * tokens``). Zero for every datasheet profile: the
    engines document the processes (docs/engine-presets-research.md, Topic D), not their timings;
    ``batchsim calibrate --from-bench`` fits them from the user's own benchmark.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    per_request_us: float = Field(0.0, ge=0, le=1e9, description="receive, parse, route: per request")
    per_prompt_token_us: float = Field(0.0, ge=0, le=1e9, description="tokenize: per prompt token")
    per_step_us: float = Field(0.0, ge=0, le=1e9, description="output processing: per engine step that emits tokens")
    per_output_token_us: float = Field(0.0, ge=0, le=1e9, description="detokenize and stream: per token emitted")

    @property
    def active(self) -> bool:
        return bool(self.per_request_us or self.per_prompt_token_us or self.per_step_us or self.per_output_token_us)


class HardwareProfile(BaseModel):
    """One device: peaks, overheads, efficiency curves, provenance."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    description: str = ""
    calibrated: bool = False
    peak_tflops: dict[str, float] = Field(description="dense TFLOP/s per dtype (no sparsity)")
    # NOTE: finite and bounded: inf or 1e300 GiB turned the KV capacity into NaN.
    memory_gib: float = Field(gt=0, le=1e6)
    hbm_bandwidth_gbs: float = Field(gt=0)
    interconnect: Interconnect
    launch_latency_us: float = Field(ge=0, description="per-kernel launch gap")
    host_overhead: HostOverhead
    frontend: FrontendOverhead = Field(default_factory=FrontendOverhead)
    memory_reserve_gib: float = Field(1.0, ge=0, le=1e6, description="CUDA context, workspaces, graphs")
    efficiency: dict[str, Efficiency] = Field(
        description="one entry per operator class; optionally per operator name (overrides its class)")
    provenance: dict[str, Any]

    @field_validator("peak_tflops")
    @classmethod
    def _peaks(cls, v: dict[str, float]) -> dict[str, float]:
        if not ({"bf16", "fp16"} & set(v)):
            raise ValueError("peak_tflops needs a bf16 or fp16 entry")
        if any(x <= 0 for x in v.values()):
            raise ValueError("peak_tflops values must be > 0")
        return v

    @field_validator("efficiency")
    @classmethod
    def _efficiency_keys(cls, v: dict[str, Efficiency]) -> dict[str, Efficiency]:
        unknown = [k for k in v if k not in OP_CLASSES and k not in OPERATORS]
        if unknown:
            raise ValueError(f"unknown efficiency entries {unknown}: use operator classes {list(OP_CLASSES)} "
                             f"or operator names {list(OPERATORS)}")
        return v

    @model_validator(mode="after")
    def _complete(self) -> "HardwareProfile":
        missing = [c for c in OP_CLASSES if c not in self.efficiency]
        if missing:
            raise ValueError(f"efficiency is missing operator classes {missing}")
        need = ["peak_tflops", "memory", "hbm_bandwidth", "interconnect", "efficiency"]
        if self.calibrated:
            need.append("calibration")
        absent = [k for k in need if k not in self.provenance]
        if absent:
            raise ValueError(f"provenance must name a source for {absent}")
        if self.calibrated:
            cal = self.provenance["calibration"]
            keys = [k for k in ("device", "software", "date") if not (isinstance(cal, dict) and k in cal)]
            if keys:
                raise ValueError(f"provenance.calibration must give {keys}")
            no_range = [c for c, e in self.efficiency.items() if e.measured_range is None]
            if no_range:
                raise ValueError(f"a calibrated profile needs measured_range for {no_range}")
        return self

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for a compute dtype (bf16 and fp16 stand in for each other)."""
        if dtype in self.peak_tflops:
            return self.peak_tflops[dtype] * 1e12
        alt = {"bf16": "fp16", "fp16": "bf16"}.get(dtype)
        if alt in self.peak_tflops:
            return self.peak_tflops[alt] * 1e12
        raise KeyError(dtype)

    @property
    def bandwidth(self) -> float:
        """Peak HBM bandwidth, bytes/s."""
        return self.hbm_bandwidth_gbs * 1e9

    @property
    def memory_bytes(self) -> float:
        """HBM capacity, bytes."""
        return self.memory_gib * 2**30


def hardware_names() -> list[str]:
    """Names of the built-in hardware profiles."""
    return catalog_names(PROFILE_DIR)


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A built-in profile by name, or a profile YAML by path (validated)."""
    path = resolve(str(name_or_path), PROFILE_DIR, "hardware profile")
    return validate(HardwareProfile, read_mapping(path), str(path))


def save_hardware(profile: HardwareProfile, path: str | Path) -> Path:
    """Write a profile as YAML (what the calibration step produces)."""
    from batchsim.sim.io import atomic_write_text

    out = Path(path)
    data = profile.model_dump(mode="json", exclude_none=True)
    atomic_write_text(out, yaml.safe_dump(data, sort_keys=False, width=100))
    return out
