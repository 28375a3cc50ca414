"""The scenario's ``workload:`` section as validated pydantic values.

A workload is either synthetic (an arrival process plus two length
distributions) or a trace replay (``trace:``). Every model forbids unknown
keys, bounds its numbers and documents each field, so a typo in a scenario
file fails on load with the field's path instead of being silently ignored.
The models hold no I/O: files named here are read by :func:`build_workload`.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from batchsim.sim.errors import bool_as_number

__all__ = [
    "PoissonArrival", "GammaArrival", "ConstantArrival", "OnOffArrival",
    "DiurnalArrival", "EmpiricalArrival", "ArrivalConfig",
    "FixedLength", "UniformLength", "LognormalLength", "EmpiricalLength", "LengthConfig",
    "TraceColumns", "LengthColumns", "AzureTrace", "MooncakeTrace", "BurstGPTTrace",
    "VllmBenchTrace", "CsvTrace", "JsonlTrace", "LengthsTrace", "TraceConfig",
    "TIMED_FORMATS", "WorkloadConfig", "NoBoolNumbers", "MAX_TOKENS", "MAX_REQUESTS", "MAX_PERIOD_REQUESTS",
]


MAX_TOKENS = 2**40
"""Largest prompt or output length accepted anywhere (keeps token arithmetic in int64)."""
MAX_REQUESTS = 100_000_000
"""Most requests a workload may generate (beyond it, memory runs out before the simulation starts)."""


class NoBoolNumbers(BaseModel):
    """A base model whose number fields refuse booleans (the scenario's models share it)."""

    @model_validator(mode="wrap")
    @classmethod
    def _no_bool_numbers(cls, data, handler):
        # NOTE: pydantic reads true as 1: `num_requests: true` ran one request.
        # (A model validator: pydantic refuses a wrap validator on a union's tag field.)
        out = handler(data)
        if isinstance(data, dict):
            for key, value in data.items():
                kind = bool_as_number(value, getattr(out, key, value)) if isinstance(key, str) else None
                if kind is not None:
                    raise ValidationError.from_exception_data(cls.__name__, [{
                        "type": PydanticCustomError("bool_number", "Input should be {kind}, not a boolean",
                                                    {"kind": kind}),
                        "loc": (key,), "input": value}])
        return out


class _Model(NoBoolNumbers):
    # NOTE: inf/NaN are refused everywhere: an infinite rate, duration or phase
    # made arrival generation loop forever, an infinite median gave 1-token lengths.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --------------------------------------------------------------------- traces


class _FileOptions(_Model):
    path: str = Field(description="Trace file; a relative path resolves against the scenario file's folder.")
    max_requests: int | None = Field(None, ge=0, description="Keep at most this many requests (the first ones, after window and sample).")
    sample: float | None = Field(None, gt=0, le=1, description="Keep this fraction of the rows, chosen at random with the workload's seed.")
    min_tokens: int = Field(1, ge=1, le=MAX_TOKENS, description="Prompt and output lengths below this are raised to it.")


class _TimedOptions(_FileOptions):
    start_s: float = Field(0.0, ge=0, description="Window start, seconds after the trace's first request.")
    end_s: float | None = Field(None, gt=0, description="Window end (exclusive), seconds after the trace's first request.")
    speedup: float = Field(1.0, gt=0, description="Replay k times faster: inter-arrival gaps are divided by k.")
    keep_time: bool = Field(False, description="Keep the file's clock (numeric times as written, timestamps from the file's first one) instead of starting at the first kept request.")

    @model_validator(mode="after")
    def _window(self) -> "_TimedOptions":
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be greater than start_s ({self.start_s})")
        return self


class TraceColumns(_Model):
    """Which columns of a generic CSV/JSONL trace hold what."""

    arrival: str = Field("arrival", description="Column with the arrival time (unit: time_unit).")
    prompt_tokens: str = Field("prompt_tokens", description="Column with the prompt length in tokens.")
    output_tokens: str = Field("output_tokens", description="Column with the output length in tokens.")


class LengthColumns(_Model):
    """Which columns of a length-only file hold the prompt and output lengths."""

    prompt_tokens: str = Field("num_prefill_tokens", description="Column with the prompt length in tokens.")
    output_tokens: str = Field("num_decode_tokens", description="Column with the output length in tokens.")


class AzureTrace(_TimedOptions):
    """Azure LLM inference trace CSV: ``TIMESTAMP, ContextTokens, GeneratedTokens``."""

    format: Literal["azure"] = Field(description="Azure LLM inference trace (2023/2024) CSV.")


class MooncakeTrace(_TimedOptions):
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``."""

    format: Literal["mooncake"] = Field(description="Mooncake (FAST'25) JSONL trace.")
    block_tokens: int = Field(512, ge=1, description="Tokens per prefix block named by one entry of hash_ids.")


class BurstGPTTrace(_TimedOptions):
    """BurstGPT CSV: ``Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type``."""

    format: Literal["burstgpt"] = Field(description="BurstGPT CSV trace.")
    model: str | list[str] | None = Field(None, description="Keep only rows of this Model (or these models), e.g. ChatGPT or GPT-4.")
    log_type: str | list[str] | None = Field(None, description="Keep only rows of this Log Type, e.g. 'Conversation log' or 'API log'.")
    failed: Literal["drop", "keep"] = Field("drop", description="Rows with 0 response tokens are failed requests: drop them, or keep them (output raised to min_tokens).")


class VllmBenchTrace(_TimedOptions):
    """The JSON that ``vllm bench serve --save-result --save-detailed`` writes."""

    format: Literal["vllm_bench"] = Field(description="vllm bench serve result JSON with per-request lists.")
    arrivals_from: Literal["recorded", "arrival"] = Field(
        "recorded",
        description="'recorded': regenerate vLLM's own arrivals from the saved request_rate and burstiness "
        "(or use start_times when the file has them); 'arrival': use the workload's arrival process.",
    )
    failed: Literal["drop", "keep"] = Field("drop", description="Requests with an error (or 0 output tokens): drop them, or keep them (output raised to min_tokens).")

    @model_validator(mode="after")
    def _timing_needs_times(self) -> "VllmBenchTrace":
        timing = sorted({"start_s", "end_s", "speedup", "keep_time"} & self.model_fields_set)
        if self.arrivals_from == "arrival" and timing:
            raise ValueError(f"{', '.join(timing)} apply to recorded arrivals; with arrivals_from: arrival "
                             "set the rate in workload.arrival instead")
        return self


class CsvTrace(_TimedOptions):
    """Any CSV with a header; ``columns`` maps its columns to ours."""

    format: Literal["csv"] = Field(description="Generic CSV trace.")
    columns: TraceColumns = Field(default_factory=TraceColumns, description="Column names for arrival, prompt_tokens and output_tokens.")
    time_unit: Literal["s", "ms", "us", "ns", "datetime"] = Field("s", description="Unit of the arrival column; 'datetime' parses timestamps.")
    sep: str = Field(",", min_length=1, description="Field separator.")


class JsonlTrace(_TimedOptions):
    """Any JSON-lines file, one object per request; ``columns`` maps its keys to ours."""

    format: Literal["jsonl"] = Field(description="Generic JSON-lines trace.")
    columns: TraceColumns = Field(default_factory=TraceColumns, description="Keys for arrival, prompt_tokens and output_tokens.")
    time_unit: Literal["s", "ms", "us", "ns", "datetime"] = Field("s", description="Unit of the arrival key; 'datetime' parses timestamps.")


class LengthsTrace(_FileOptions):
    """A length-only file (CSV, or JSONL by suffix) replayed with the ``arrival`` process."""

    format: Literal["lengths"] = Field(description="Prompt/output lengths without times; arrivals come from workload.arrival.")
    columns: LengthColumns = Field(default_factory=LengthColumns, description="Column names for prompt_tokens and output_tokens.")
    shuffle: bool = Field(False, description="Replay the rows in a random order (seeded) instead of file order.")


TraceConfig = Annotated[
    Union[AzureTrace, MooncakeTrace, BurstGPTTrace, VllmBenchTrace, CsvTrace, JsonlTrace, LengthsTrace],
    Field(discriminator="format"),
]
TIMED_FORMATS = ("azure", "mooncake", "burstgpt", "csv", "jsonl")
"""Formats whose files carry arrival times."""


def supplies_arrivals(trace) -> bool:
    """Whether ``trace`` (a validated trace config, or None), not ``workload.arrival``, decides
    when requests arrive."""
    if trace is None or trace.format == "lengths":
        return False
    return not (trace.format == "vllm_bench" and trace.arrivals_from == "arrival")


_TRACE = TypeAdapter(TraceConfig)


# ------------------------------------------------------------------- arrivals


class PoissonArrival(_Model):
    """Exponential gaps: the memoryless open-loop load of most benchmarks."""

    process: Literal["poisson"] = Field(description="Poisson process.")
    rate: float = Field(ge=0, description="Mean requests per second; 0 gives no requests.")


class GammaArrival(_Model):
    """Gamma gaps with a coefficient of variation: cv > 1 is burstier than Poisson."""

    process: Literal["gamma"] = Field(description="Gamma renewal process (vLLM's --burstiness = 1/cv^2).")
    rate: float = Field(ge=0, description="Mean requests per second; 0 gives no requests.")
    cv: float = Field(gt=0, le=100, description="Coefficient of variation of the gaps (1 = Poisson), 0.001 to 100.")

    @field_validator("cv")
    @classmethod
    def _cv(cls, v: float) -> float:
        # NOTE: bounded: cv ~ 0 divided by zero (shape 1/cv^2), a huge cv takes ~cv^2 draws per gap.
        if v < 0.001:
            raise ValueError(f"cv {v:g} is too small; expected 0.001 to 100 (use process: constant for even gaps)")
        return v


class ConstantArrival(_Model):
    """Evenly spaced requests."""

    process: Literal["constant"] = Field(description="One request every 1/rate seconds.")
    rate: float = Field(ge=0, description="Requests per second; 0 gives no requests.")


MAX_PERIOD_REQUESTS = 1e7
"""Most requests an on/off period may hold on average."""


class OnOffArrival(_Model):
    """Two-state Markov-modulated Poisson process: bursts and lulls."""

    process: Literal["onoff"] = Field(description="On/off bursts (two-state MMPP).")
    rate_on: float = Field(ge=0, description="Requests per second while on.")
    rate_off: float = Field(0.0, ge=0, description="Requests per second while off.")
    mean_on_s: float = Field(ge=0.001, description="Mean length of an on period, seconds (exponential, >= 1 ms).")
    mean_off_s: float = Field(ge=0.001, description="Mean length of an off period, seconds (exponential, >= 1 ms).")

    @model_validator(mode="after")
    def _per_period(self) -> "OnOffArrival":
        # NOTE: every arrival of a period is drawn at once; 10^14 of them ran out of memory.
        for state in ("on", "off"):
            rate, mean = getattr(self, f"rate_{state}"), getattr(self, f"mean_{state}_s")
            if rate * mean > MAX_PERIOD_REQUESTS:
                raise ValueError(f"rate_{state} x mean_{state}_s = {rate * mean:.6g} requests per {state} period; "
                                 f"expected at most {MAX_PERIOD_REQUESTS:.0e}")
        return self


class DiurnalArrival(_Model):
    """Poisson with a sinusoidal rate: rate * (1 + amplitude * cos(2 pi (t - phase_s) / period_s))."""

    process: Literal["diurnal"] = Field(description="Time-varying Poisson rate (thinning).")
    rate: float = Field(ge=0, description="Mean requests per second over a period.")
    amplitude: float = Field(0.5, ge=0, le=1, description="Relative swing of the rate around its mean (0..1).")
    period_s: float = Field(86400.0, ge=0.001, description="Period of the rate curve, seconds (>= 1 ms).")
    phase_s: float = Field(0.0, description="Time of the rate's peak, seconds.")


class EmpiricalArrival(_Model):
    """Resample the inter-arrival gaps of a trace (i.i.d. bootstrap)."""

    process: Literal["empirical"] = Field(description="Inter-arrival gaps drawn from a trace.")
    trace: TraceConfig = Field(description="The trace whose gaps are resampled (a format with times).")
    rate: float | None = Field(None, ge=0, description="Rescale gaps to this mean rate (req/s); default: the trace's own rate.")

    @model_validator(mode="after")
    def _timed(self) -> "EmpiricalArrival":
        if self.trace.format not in TIMED_FORMATS:
            raise ValueError(f"trace.format '{self.trace.format}' has no arrival times; expected one of {', '.join(TIMED_FORMATS)}")
        return self


class ClosedArrival(_Model):
    """A closed loop: ``concurrency`` clients, each sending its next request when its last one
    ends, after a think time (`vllm bench serve --max-concurrency N` with an unlimited request
    rate, GuideLLM's concurrent profile, genai-perf's --concurrency)."""

    process: Literal["closed"] = Field(description="Closed loop: N clients, the next request when the last one ends.")
    concurrency: int = Field(ge=1, le=MAX_REQUESTS, description="Clients (requests in flight, less the thinking ones).")
    think_time_s: float = Field(0.0, ge=0, allow_inf_nan=False,
                                description="Mean wait between a client's response and its next request (s).")
    think: Literal["constant", "exponential"] = Field(
        "constant", description="Think times: each exactly think_time_s, or exponential with that mean.")

    @field_validator("concurrency", mode="before")
    @classmethod
    def _whole(cls, v):
        if isinstance(v, bool):
            raise ValueError("expected a whole number of clients, got a boolean")
        return v


ArrivalConfig = Annotated[
    Union[PoissonArrival, GammaArrival, ConstantArrival, OnOffArrival, DiurnalArrival, EmpiricalArrival,
          ClosedArrival],
    Field(discriminator="process"),
]


# -------------------------------------------------------------------- lengths


class FixedLength(_Model):
    dist: Literal["fixed"] = Field(description="Every request has the same length.")
    value: int = Field(ge=1, le=MAX_TOKENS, description="Tokens.")


class UniformLength(_Model):
    dist: Literal["uniform"] = Field(description="Uniform integers in [min, max].")
    min: int = Field(ge=1, le=MAX_TOKENS, description="Smallest length, tokens (inclusive).")
    max: int = Field(ge=1, le=MAX_TOKENS, description="Largest length, tokens (inclusive).")

    @model_validator(mode="after")
    def _order(self) -> "UniformLength":
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class LognormalLength(_Model):
    dist: Literal["lognormal"] = Field(description="Lognormal given by its median and 90th percentile, rounded and clipped to [min, max].")
    median: float = Field(gt=0, le=MAX_TOKENS, description="Median length, tokens.")
    p90: float = Field(gt=0, le=MAX_TOKENS, description="90th percentile, tokens (>= median).")
    max: int | None = Field(None, ge=1, le=MAX_TOKENS, description="Longer draws are clipped to this (e.g. the model's context).")
    min: int = Field(1, ge=1, le=MAX_TOKENS, description="Shorter draws are raised to this.")

    @model_validator(mode="after")
    def _order(self) -> "LognormalLength":
        if self.p90 < self.median:
            raise ValueError(f"p90 ({self.p90}) must be >= median ({self.median})")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class EmpiricalLength(_Model):
    dist: Literal["empirical"] = Field(description="Draw (with replacement) from a column of a file.")
    path: str = Field(description="CSV or JSONL file; a relative path resolves against the scenario file's folder.")
    column: str = Field(description="Column (CSV) or key (JSONL) holding token counts.")
    format: Literal["csv", "jsonl"] | None = Field(None, description="File format; default from the suffix (.jsonl/.json = jsonl, else csv).")


LengthConfig = Annotated[
    Union[FixedLength, UniformLength, LognormalLength, EmpiricalLength],
    Field(discriminator="dist"),
]


# ------------------------------------------------------------------- workload


def _default_arrival() -> PoissonArrival:
    return PoissonArrival(process="poisson", rate=5.0)


def _default_prompt() -> LognormalLength:
    return LognormalLength(dist="lognormal", median=512, p90=2048, max=8192)


def _default_output() -> FixedLength:
    return FixedLength(dist="fixed", value=128)


class SharedPrefixConfig(_Model):
    """Synthetic shared prefixes (system prompts, few-shot templates) for prefix caching.

    Each request, with probability ``fraction``, belongs to one of ``groups``
    prompt templates, chosen uniformly; its first ``min(tokens, prompt)``
    tokens are that template's. The rest of its prompt is its own.
    """

    groups: int = Field(ge=1, le=2**20, description="Distinct shared prefixes (templates).")
    tokens: int = Field(ge=1, le=MAX_TOKENS, description="Tokens of each shared prefix.")
    fraction: float = Field(1.0, ge=0, le=1, description="Share of requests that start with a template.")
    block_tokens: int = Field(512, ge=1, description="Tokens per prefix block (hash unit).")


class WorkloadConfig(_Model):
    """The ``workload:`` section: a synthetic workload or a trace replay."""

    num_requests: int | None = Field(
        None, ge=0, le=MAX_REQUESTS,
        description="Requests to generate; with a trace, an upper bound on the requests kept.",
    )
    duration_s: float | None = Field(
        None, ge=0,
        description="Generate arrivals before this time (s); with a trace, keep arrivals before it (after rebasing).",
    )
    arrival: ArrivalConfig = Field(default_factory=_default_arrival, description="Arrival process (not used when the trace has times).")
    prompt_tokens: LengthConfig = Field(default_factory=_default_prompt, description="Prompt length distribution (not used with a trace).")
    output_tokens: LengthConfig = Field(default_factory=_default_output, description="Output length distribution (not used with a trace).")
    trace: TraceConfig | None = Field(None, description="Replay a trace file instead of sampling.")
    shared_prefix: SharedPrefixConfig | None = Field(
        None, description="Give requests shared prompt prefixes (for prefix caching); not with a Mooncake trace, "
                          "which has its own hash_ids.")

    @model_validator(mode="before")
    @classmethod
    def _replaced(cls, data):
        # NOTE: a section the trace overrides is an error, not silently ignored:
        # a scenario that sets arrival.rate next to an Azure trace would otherwise
        # report results for a load it never simulated. Checked before the sections
        # themselves: `--set workload.arrival.rate=20` next to a trace made an arrival
        # without a process, and its "missing 'process'" hid the real mistake.
        if not isinstance(data, dict) or data.get("trace") is None:
            return data
        try:
            trace = _TRACE.validate_python(data["trace"])
        except ValidationError:
            return data  # (the trace's own error, from the validation that follows)
        ignored = [f for f in ("arrival", "prompt_tokens", "output_tokens") if f in data
                   and (f != "arrival" or supplies_arrivals(trace))]
        if ignored:
            raise ValueError(
                f"{', '.join(ignored)} cannot be combined with trace (format '{trace.format}'), "
                "which supplies them; remove them or use format 'lengths'"
            )
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "WorkloadConfig":
        if self.shared_prefix is not None and self.trace is not None and self.trace.format == "mooncake":
            raise ValueError("shared_prefix cannot be combined with a mooncake trace, which has its own hash_ids")
        if self.arrival.process == "closed":
            if self.num_requests is None and self.trace is None:
                raise ValueError("a closed loop sends requests until num_requests have been sent: set num_requests")
            if self.duration_s is not None:
                raise ValueError("duration_s bounds arrival times, which a closed loop makes as it runs; "
                                 "set num_requests (and horizon_s to stop the clock)")
            if self.trace is not None and self.trace_has_arrivals:
                raise ValueError("a closed loop makes its own arrival times: use a 'lengths' trace, or a "
                                 "'vllm_bench' one with trace.arrivals_from: arrival")
        if self.trace is None and self.num_requests is None and self.duration_s is None:
            raise ValueError("set num_requests or duration_s (or both) for a synthetic workload")
        return self

    @property
    def trace_has_arrivals(self) -> bool:
        """Whether the trace, not ``arrival``, decides when requests arrive."""
        return supplies_arrivals(self.trace)
