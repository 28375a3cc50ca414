"""Scenario files: one YAML document, validated on load.

Field names follow what users already know: HuggingFace names for models,
vLLM engine-argument names for limits. The ``policy`` section is validated by
the chosen policy's own config model, the ``workload`` section by
:class:`batchsim.workloads.config.WorkloadConfig`. Every error names the file, the
field and the bad value (an :class:`batchsim.sim.errors.InputError`).
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator, model_validator

from batchsim.calibrate.hardware import FrontendOverhead, HostOverhead

from batchsim.sim.errors import InputError
from batchsim.sim.safe_yaml import DuplicateKeyError, load_yaml
from batchsim.workloads.config import NoBoolNumbers, WorkloadConfig

__all__ = ["Scenario", "naming_file", "DisaggregationConfig", "PoolConfig", "LinkConfig", "SLOConfig", "MeasureConfig", "VLLM_BLOCK_SIZES", "load_scenario", "scenario_from_dict",
           "apply_overrides", "format_validation_error", "short_repr"]


class SLOConfig(NoBoolNumbers):
    """Per-request service-level objectives (a request meets them or not)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ttft_ms: float | None = Field(None, gt=0, description="time to first token limit")
    tpot_ms: float | None = Field(None, gt=0, description="time per output token limit")
    itl_ms: float | None = Field(None, gt=0, description="limit on a request's largest inter-token gap")
    e2el_ms: float | None = Field(None, gt=0, description="end-to-end latency limit")

    def limits(self) -> dict[str, float]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class MeasureConfig(NoBoolNumbers):
    """Which requests the latency percentiles and throughputs count."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    warmup_s: float = Field(0.0, ge=0, description="ignore requests arriving before this time")
    cooldown_s: float = Field(0.0, ge=0, description="ignore requests arriving this long before the last arrival")
    warmup_requests: int = Field(0, ge=0, description="ignore the first this many arrivals too (a closed loop's "
                                                      "clients all send at t=0: plan sets it to the clients)")
    cooldown_requests: int = Field(0, ge=0, description="ignore the last this many arrivals too (a closed loop "
                                                        "winds down as its clients run out of requests)")
    step_records: bool = Field(True, description="write the step records (steps.csv or steps.parquet, one row "
                                                 "per step; batchsim run streams them to the file as it goes)")
    records: Literal["full", "aggregate"] = Field(
        "full", description="'full': keep a row per step; 'aggregate': keep none and write no step file "
                            "(the summary, from running totals and the gap records, is the same either way; "
                            "batchsim/sim/aggregate.py, batchsim/sim/itl.py)")


class _Terms(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _overrides_of(terms: type[BaseModel], doc: str) -> type[_Terms]:
    """A model of optional overrides of ``terms``' fields: the same names, bounds and descriptions
    (batchsim.calibrate.hardware states the terms once), each unset by default."""
    fields = {name: (Annotated[(float, *f.metadata)] | None, Field(None, description=f.description))
              for name, f in terms.model_fields.items()}
    return create_model(f"{terms.__name__}Terms", __base__=_Terms, __doc__=doc, **fields)


HostTerms = _overrides_of(HostOverhead, "Overrides of the hardware profile's host_overhead terms.")
FrontendTerms = _overrides_of(FrontendOverhead, "Overrides of the hardware profile's frontend terms.")


class OverheadConfig(NoBoolNumbers):
    """Host and frontend overhead terms that replace the hardware profile's (unset: the profile's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host: HostTerms = Field(default_factory=HostTerms)
    frontend: FrontendTerms = Field(default_factory=FrontendTerms)

    def updates(self) -> dict[str, dict[str, float]]:
        """``{host_overhead: {...}, frontend: {...}}`` of the terms set (the profile's field names)."""
        out = {}
        for field, terms in (("host_overhead", self.host), ("frontend", self.frontend)):
            set_ = {k: v for k, v in terms.model_dump().items() if v is not None}
            if set_:
                out[field] = set_
        return out


class PoolConfig(NoBoolNumbers):
    """One pool of a disaggregated deployment: its replicas, and what differs from the scenario's
    top level (unset: the scenario's hardware, tensor_parallel_size and policy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    replicas: int = Field(1, ge=1, le=4096)
    hardware: str | None = Field(None, description="hardware profile (unset: the scenario's)")
    tensor_parallel_size: int | None = Field(None, ge=1, le=64, description="unset: the scenario's")
    policy: dict[str, Any] | None = Field(None, description="this pool's policy (unset: the scenario's)")
    router: str = Field("round_robin", description="round_robin | least_outstanding | power_of_two | least_kv | cache_aware")

    @field_validator("policy", mode="before")
    @classmethod
    def _pool_policy(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"name": v}
        if isinstance(v, dict) and "name" not in v:
            raise ValueError("the policy needs a 'name' (static, dynamic, continuous, chunked_prefill)")
        return v


class LinkConfig(NoBoolNumbers):
    """The KV-transfer link between the pools (batchsim.sim.disagg.KVLink)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    bandwidth_gbps: float = Field(
        400.0, ge=0.001, le=1e7, description="per GPU, Gbit/s: each GPU its own NIC (DGX H100: one 400 Gb/s ConnectX-7 per GPU); "
                                 "a replica has tensor_parallel_size of them")
    latency_us: float = Field(10.0, ge=0, le=1e9, description="per transfer, after its last byte is sent (RDMA setup, "
                                                      "the completion notice)")
    transfer: Literal["per_request", "per_layer", "per_chunk"] = Field(
        "per_request", description="per_request: the prompt's KV is read when its prefill ends (vLLM's NIXL "
                                   "connector); per_layer: each layer's KV leaves as it is computed (Splitwise); "
                                   "per_chunk: the whole blocks each prefill chunk computed leave when its step "
                                   "ends, the rest with the last (SGLang's send_kv_chunk; needs pairing: "
                                   "at_arrival)")


class DisaggregationConfig(NoBoolNumbers):
    """Prefill and decode on separate pools (batchsim.sim.disagg; docs/disaggregation.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    prefill: PoolConfig = Field(default_factory=PoolConfig)
    decode: PoolConfig = Field(default_factory=PoolConfig)
    link: LinkConfig = Field(default_factory=LinkConfig)
    first_token: Literal["prefill", "decode"] = Field(
        "prefill", description="prefill: the token the prefill replica samples reaches the client with the KV "
                               "(SGLang); decode: the decode replica recomputes the last prompt token and "
                               "samples the first token itself (vLLM's NIXL connector)")
    pairing: Literal["after_prefill", "at_arrival"] = Field(
        "after_prefill", description="after_prefill: the decode replica is chosen and its blocks taken when the "
        "prefill ends (vLLM's proxy and NIXL connector); at_arrival: the router pairs a prefill and a decode "
        "replica as the request arrives, the decode replica pre-allocates the prompt's KV and only then may the "
        "prefill start (SGLang's mini_lb, bootstrap queue and DecodePreallocQueue)")
    reserved_decode_tokens: int = Field(
        512, ge=0, le=10**7, description="pairing at_arrival: the tokens a decode replica keeps free for each "
        "request it runs, queues or has pre-allocated before it pre-allocates another "
        "(SGLANG_NUM_RESERVED_DECODE_TOKENS, default 512)")

    @model_validator(mode="after")
    def _reserve_needs_prealloc(self) -> "DisaggregationConfig":
        if self.link.transfer == "per_chunk" and self.pairing != "at_arrival":
            raise ValueError("link.transfer per_chunk sends each prefill chunk to decode blocks allocated before "
                             "the prefill: it needs pairing: at_arrival (SGLang's way), not "
                             f"{self.pairing!r}")
        if "reserved_decode_tokens" in self.model_fields_set and self.pairing != "at_arrival":
            raise ValueError(f"reserved_decode_tokens ({self.reserved_decode_tokens}) is the decode pool's reserve "
                             "when it pre-allocates at arrival; it does nothing with pairing "
                             f"{self.pairing!r} (set pairing: at_arrival, or drop it)")
        return self


class Scenario(NoBoolNumbers):
    """A whole simulation: model, hardware, cluster, policy, workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field("scenario", description="a label for reports")
    model: str = Field("llama-3-8b", description="catalog name or path to a HF config.json")
    hardware: str = Field("h100-sxm", description="hardware profile name or path to a profile YAML")
    engine_preset: str | None = Field(
        None, description="a serving engine's documented defaults for the policy section: vllm-v1 | vllm-v0 | "
                          "sglang | trtllm (batchsim/engines/; the scenario's own policy keys win)")
    overheads: OverheadConfig = Field(
        default_factory=OverheadConfig, description="host and frontend overhead terms replacing the profile's")
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    dtype: Literal["bf16", "fp16", "fp8", "int4"] = Field("bf16", description="weight dtype")
    kv_cache_dtype: Literal["auto", "bf16", "fp16", "fp8"] = Field("auto", description="KV dtype (auto = dtype, bf16 for int4)")
    replicas: int = Field(1, ge=1, le=4096)
    router: str = Field("round_robin", description="round_robin | least_outstanding | power_of_two | least_kv | cache_aware")
    policy: dict[str, Any] = Field(default_factory=lambda: {"name": "continuous"})
    policy_knobs: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="knobs per policy name, used when compare/sweep/plan run a policy other than "
                    "`policy` (e.g. {static: {max_batch_size: 16}})")
    workload: WorkloadConfig
    slo: SLOConfig = Field(default_factory=SLOConfig)
    seed: int = Field(0, ge=0)
    horizon_s: float | None = Field(None, gt=0, description="stop the simulation at this time")
    max_queue_len: int | None = Field(None, ge=1, description="reject arrivals beyond this many waiting per replica")
    measure: MeasureConfig = Field(default_factory=MeasureConfig)
    engine: Literal["auto", "python", "core"] = Field(
        "auto", description="auto: the compiled core (batchsim/core/_core.c) when it covers the scenario and a C "
                            "compiler is at hand, else the Python engine; python; core (an error if it "
                            "cannot). Both give the same records byte for byte")

    disaggregation: DisaggregationConfig | None = Field(
        None, description="serve prefill and decode on separate pools with a KV-transfer link between them; "
                          "the pools' replicas replace `replicas` and `router`")
    engine_preset_values: dict[str, Any] = Field(
        default_factory=dict,
        description="(written by batchsim when it applies engine_preset) the policy values the preset filled: "
                    "a key still holding its value is the preset's, resolved again when the hardware, tp or "
                    "preset changes; leave unset")

    @model_validator(mode="after")
    def _pools_not_replicas(self) -> "Scenario":
        if self.disaggregation is not None:
            for name in ("replicas", "router"):
                # NOTE: the default written out is allowed (it says nothing): so a file that names
                # replicas or router has a command that runs it disaggregated (--set replicas=1)
                if name in self.model_fields_set and getattr(self, name) != type(self).model_fields[name].default:
                    raise ValueError(f"{name} is for a colocated deployment; with disaggregation set "
                                     f"disaggregation.prefill.{name} and disaggregation.decode.{name}")
        return self

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_name(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, str):
            return {"name": v}
        if isinstance(v, dict) and "name" not in v and not info.data.get("engine_preset"):
            raise ValueError("the policy needs a 'name' (static, dynamic, continuous, chunked_prefill)")
        return v


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 2


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to a line. NOTE: a YAML alias bomb (a few hundred bytes
    that expand to 10^8 items) made a plain repr take minutes and gigabytes."""
    text = _REPR.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def format_validation_error(err: ValidationError, source: str,
                            model: type[BaseModel] | None = None) -> str:
    """One line per problem: ``source: field.path: message (got value)``.

    With ``model`` (the class validated), the path is the one the user wrote
    (pydantic's union tags such as ``poisson`` in ``arrival.poisson.rate`` are
    dropped) and an unknown field lists the fields allowed there.
    """
    lines = []
    for e in err.errors():
        path, parents, models = _user_path(model, e["loc"])
        got = e.get("input")
        shown = "" if e["type"] == "missing" or isinstance(got, dict) else f" (got {short_repr(got)})"
        msg = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        names = sorted({f for m in parents for f in m.model_fields})
        if e["type"] == "extra_forbidden" and names:
            msg = f"unknown field; expected one of {', '.join(names)}"
        elif e["type"] == "union_tag_not_found":
            key = str(e.get("ctx", {}).get("discriminator", "")).strip("'\"")
            tags = [t for m in models for t in _literals(m, key)]
            if tags:
                msg, shown = f"missing '{key}'; expected one of {', '.join(tags)}", ""
        lines.append(f"{source}: {path}: {msg}{shown}" if path else f"{source}: {msg}{shown}")
    return "\n".join(lines)


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (Optional, Union and Annotated unwrapped)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) is Annotated:
        return _models(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        return [m for a in get_args(annotation) for m in _models(a)]
    return []


def _literals(model: type[BaseModel], key: str) -> list[str]:
    field = model.model_fields.get(key)
    return [str(a) for a in get_args(field.annotation)] if field is not None and \
        get_origin(field.annotation) is Literal else []


def _user_path(model: type[BaseModel] | None, loc: tuple) -> tuple[str, list, list]:
    """(the dotted path as written in the file, the models its last key belongs to,
    the models its value can be)."""
    parts: list[str] = []
    cands = [model] if model is not None else []
    parents = cands
    for p in loc:
        key = str(p)
        if key.startswith("function-"):
            continue
        if len(cands) > 1:  # a tagged union: pydantic puts the tag in the path
            tagged = [m for m in cands if any(key in _literals(m, f) for f in m.model_fields)]
            if len(tagged) == 1:
                cands = parents = tagged
                continue
        parents = cands
        fields = [m.model_fields[key] for m in cands if key in m.model_fields]
        cands = _models(fields[0].annotation) if len(fields) == 1 else []
        parts.append(key)
    return ".".join(parts), parents, cands


def _set_dotted(d: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for depth, k in enumerate(keys[:-1]):
        nxt = d.get(k)
        if isinstance(nxt, str) and k == "policy":
            nxt = {"name": nxt}
        if nxt is None and depth == 0 and k == "policy":  # --set policy.knob=v keeps the default policy
            # (or, with an engine preset, the preset's: a policy without a name takes its name)
            nxt = ({} if d.get("engine_preset") else
                   Scenario.model_fields["policy"].get_default(call_default_factory=True))
        if not isinstance(nxt, dict):
            nxt = {}
        d[k] = nxt
        d = nxt
    d[keys[-1]] = value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``dotted.key=value`` overrides (values parsed as YAML)."""
    for item in overrides:
        if "=" not in item:
            raise InputError(f"expected dotted.key=value, got {item!r}", "--set")
        key, raw = item.split("=", 1)
        if not key.strip():
            raise InputError(f"empty key in {item!r}", "--set")
        if any(not k.strip() for k in key.split(".")):
            raise InputError(f"empty field name in {key.strip()!r}; expected dotted.key=value "
                             "such as workload.arrival.rate=8", "--set")
        try:
            value = load_yaml(raw)
        except DuplicateKeyError as e:
            raise InputError(f"duplicate key {e.key!r} in {item!r}; expected each key once", "--set") from None
        except (yaml.YAMLError, RecursionError):  # not YAML: keep the text, validation says what is wrong
            value = raw
        _set_dotted(data, key.strip(), value)
        filled = data.get("engine_preset_values")
        path = key.strip().split(".")
        if isinstance(filled, dict) and path[0] == "policy":  # (a key set here is the user's, not the preset's)
            if len(path) == 1:
                filled.clear()
            elif len(path) > 2 and isinstance(filled.get(path[1]), dict):  # one key of a section the preset
                filled[path[1]].pop(path[2], None)                          # filled: the rest stays the preset's
            else:
                filled.pop(path[1], None)
    return data


def scenario_from_dict(data: Any, source: str = "scenario") -> Scenario:
    """Validate a scenario mapping; errors name ``source`` and the field."""
    if not isinstance(data, dict):
        raise InputError(f"expected a mapping of scenario fields, got {type(data).__name__}", source)
    if "fast_forward" in data:
        raise InputError("fast_forward: this field was removed (the Python engine runs step by step; "
                         "engine: auto picks the compiled core, the fast one); delete it", source)
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as e:
        raise InputError(format_validation_error(e, source, Scenario)) from None
    if sc.engine_preset is not None or sc.engine_preset_values:
        from batchsim.engines import apply_preset

        try:
            sc = apply_preset(sc)
        except InputError as e:
            raise InputError(e.message, f"{source}: {e.where}" if e.where else source) from None
    _check_block_sizes(sc, source)
    return sc


VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
"""The KV block sizes vLLM accepts (``--block-size``; ``BlockSize`` in vllm/config/cache.py)."""


def _check_block_sizes(sc: Scenario, source: str) -> None:
    """A ``block_size`` vLLM would refuse is an error. (Here, not in the policy config: policy
    tests run any block size on tiny fake caches.) A value that is no number is left to the policy."""
    specs = [("policy", sc.policy)] + [(f"policy_knobs.{n}", k) for n, k in sc.policy_knobs.items()]
    if sc.disaggregation is not None:
        specs += [(f"disaggregation.{n}.policy", p.policy) for n, p in
                  (("prefill", sc.disaggregation.prefill), ("decode", sc.disaggregation.decode)) if p.policy]
    for where, spec in specs:
        bs = spec.get("block_size") if isinstance(spec, dict) else None
        if isinstance(bs, (int, float)) and not isinstance(bs, bool) and bs not in VLLM_BLOCK_SIZES:
            raise InputError(f"got {short_repr(bs)}; expected one of vLLM's block sizes "
                             f"{', '.join(map(str, VLLM_BLOCK_SIZES))}", f"{source}: {where}.block_size")


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read, override and validate a scenario YAML file (safe loading only)."""
    p = Path(path)
    try:
        is_dir, is_file = p.is_dir(), p.is_file()
    except (OSError, ValueError):  # a name the OS refuses: a NUL byte, too long
        is_dir = is_file = False
    if is_dir:
        raise InputError("is a folder; expected a scenario YAML file", str(p))
    if not is_file:
        raise InputError(f"no such scenario file: {p}")
    try:
        data = load_yaml(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        raise InputError(f"not valid YAML: {getattr(e, 'problem', e)}", where) from None
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text ({e.reason} at byte {e.start})", str(p)) from None
    except RecursionError:
        raise InputError("nested too deeply; expected a mapping of scenario fields", str(p)) from None
    if not isinstance(data, dict):
        raise InputError(f"expected a mapping of scenario fields, got {type(data).__name__}", str(p))
    data = apply_overrides(data, list(overrides or []))
    return scenario_from_dict(data, str(p))


def naming_file(scenario: str | Path | None, fn, *args):
    """``fn(*args)``; an InputError about a scenario field (``policy.max_num_seqs``,
    ``router``) raised while building or running gets the scenario file in front
    (what ``batchsim run`` and ``batchsim regress`` print for a bad field)."""
    try:
        return fn(*args)
    except InputError as e:
        head = (e.where or "").split(".")[0]
        if scenario is None or head not in Scenario.model_fields:
            raise
        raise InputError(e.message, f"{scenario}: {e.where}") from None
