"""Engine presets: a real serving engine's documented defaults, as scenario defaults.

``engine_preset: vllm-v1 | vllm-v0 | sglang | trtllm`` in a scenario fills the ``policy``
section with what that engine does when its user sets nothing: which batching policy its
scheduler is (chunked prefill mixed with decodes, prefill-first steps, whole prompts), its
limits, KV block size, memory fraction and admission rule. Each preset is one YAML file
here whose every knob names the source line it was read in (the engine's own code, at the
release the file names); docs/engine-presets-research.md has the reading notes and
docs/fidelity.md what the presets leave out.

Keys the scenario sets itself win. A knob the scenario's policy does not take (a preset made
for chunked prefill, a scenario that runs ``static``) is left out, and the run's summary says
so: :func:`preset_report` lists every knob with its value in effect and where it came from
(``preset`` or ``scenario``), plus the preset's notes.

Knobs may depend on the deployment, as the engines' own defaults do: ``rules`` pick a value
by the device's memory (and name), ``derive`` computes one from the model and KV pool, and
``when: prefix_hashes`` turns prefix caching on only for a workload that names shared
prefixes (without them batchsim cannot tell which prompts share KV).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from batchsim.sim.errors import InputError

__all__ = ["PRESETS", "Preset", "load_preset", "apply_preset", "preset_report", "preset_markdown",
           "vllm_v1_capture_sizes", "device_names", "user_policy"]

_DIR = Path(__file__).parent
PRESETS: tuple[str, ...] = tuple(sorted(p.stem for p in _DIR.glob("*.yaml")))


class Rule(BaseModel):
    """A deployment-dependent value: applies when the device has at least ``min_memory_gib``, none of
    its names (:func:`device_names`: a calibrated profile's also name the device it was made from)
    contains any of ``except_names``, and the context length (``max_model_len``, else the model's) is
    at least ``min_context_tokens``; the last rule that applies wins."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    min_memory_gib: float = Field(0.0, ge=0)
    except_names: tuple[str, ...] = ()
    min_context_tokens: int = Field(0, ge=0)
    when_policy: str | None = None  # applies only when the resolved policy is this one
    value: Any


class Knob(BaseModel):
    """One policy knob of a preset: its value (or how it is derived) and where it was read."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value: Any = None
    rules: tuple[Rule, ...] = ()
    derive: Literal["max_model_len_at_least_2048", "sglang_max_running_requests", "vllm_v1_cuda_graphs",
                    "vllm_v0_cuda_graphs", "sglang_cuda_graphs"] | None = None
    when: Literal["prefix_hashes"] | None = None
    source: str = Field(min_length=1)


class Preset(BaseModel):
    """An engine's defaults (one YAML file of batchsim/engines/)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    engine: str
    version: str
    policy: dict[str, Knob]
    notes: tuple[str, ...] = ()


@lru_cache(maxsize=None)
def load_preset(name: str) -> Preset:
    """The preset called ``name``; InputError naming the choices otherwise."""
    if name not in PRESETS:
        raise InputError(f"unknown engine preset {name!r}; expected one of {', '.join(PRESETS)}", "engine_preset")
    from batchsim.sim.safe_yaml import load_yaml

    path = _DIR / f"{name}.yaml"
    try:
        return Preset.model_validate(load_yaml(path.read_text(encoding="utf-8")))
    except ValidationError as e:  # pragma: no cover - a shipped file is checked by the tests
        raise RuntimeError(f"{path}: {e}") from None


def _hardware(scenario):
    from batchsim.calibrate.hardware import load_hardware

    return load_hardware(scenario.hardware)


def _has_prefix_hashes(scenario) -> bool:
    wl = scenario.workload
    trace = getattr(wl, "trace", None)
    return wl.shared_prefix is not None or (trace is not None and getattr(trace, "format", None) == "mooncake")


def _context(scenario, policy: dict) -> int:
    from batchsim.calibrate.models import load_model

    asked = policy.get("max_model_len")
    model_len = int(load_model(scenario.model).max_position_embeddings)
    return int(asked) if isinstance(asked, int) and not isinstance(asked, bool) else model_len


def _count(policy: dict, key: str, default: int) -> int | None:
    """``policy[key]`` as the policy's validation will read it, if it is a count >= 1; None otherwise (the
    knob's own check then names it: a size list derived from a bad value would only add a second error)."""
    v = policy.get(key, default)
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None


def device_names(hw) -> tuple[str, ...]:
    """The names that say which device a hardware profile is (lower case), for the presets' rules by
    device: the profile's own name, and, for a calibrated profile (which ``--name`` may call anything),
    the profile it was fitted from (``provenance.from_bench.base_profile``, written by ``calibrate
    --from-bench``) and the device its kernels were timed on (``provenance.calibration.device``)."""
    prov = getattr(hw, "provenance", None) or {}
    bench, cal = prov.get("from_bench"), prov.get("calibration")
    names = [hw.name, bench.get("base_profile") if isinstance(bench, dict) else None,
             cal.get("device") if isinstance(cal, dict) else None]
    return tuple(dict.fromkeys(str(n).lower() for n in names if isinstance(n, str) and n))


def _named(hw, *parts: str) -> bool:
    """Whether one of the profile's :func:`device_names` contains one of ``parts``."""
    return any(x in name for name in device_names(hw) for x in parts)


def _blackwell(hw) -> bool:
    """vLLM's ``is_device_capability_family(100)``: data-centre Blackwell (B200, GB200, B300, GB300)."""
    return _named(hw, "b200", "b300")


def _rocm(hw) -> bool:
    """An AMD Instinct GPU (ROCm/HIP), by the profile's names."""
    # (not plain "amd": a kernel calibration on a CPU names the host's processor, "AMD EPYC ...")
    return (any(name.startswith("mi") for name in device_names(hw))
            or _named(hw, "instinct", "-mi", "rocm", "radeon"))


def vllm_v1_capture_sizes(seqs: int, tokens: int, blackwell: bool = False) -> list[int]:
    """vLLM 0.33.0 VllmConfig._set_cudagraph_sizes (config/vllm.py:2446-2600) at its defaults (no
    speculative decoding, performance_mode 'balanced') for ``max_num_seqs`` ``seqs`` and
    ``max_num_batched_tokens`` ``tokens``: one list of token counts for every step (the reference
    executor's graphs take it too: batchsim.calibrate.graphs.CAPTURE_SIZES)."""
    default_max = 1024 if blackwell else 512  # (capability family 100: data-centre Blackwell)
    top = min(seqs * 2, default_max)
    decode = [seqs] if seqs <= top else []
    top = min(tokens, top)
    sizes = [i for i in (1, 2, 4) if i <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    if tokens <= top and tokens not in sizes:
        sizes.append(tokens)
    return sorted(set(sizes + [v for v in decode if v <= tokens]))


def _vllm_v1_graphs(policy: dict, hw) -> dict | None:
    """The vllm-v1 preset's ``cuda_graphs``: :func:`vllm_v1_capture_sizes` for the deployment."""
    seqs, tokens = _count(policy, "max_num_seqs", 256), _count(policy, "max_num_batched_tokens", 8192)
    if seqs is None or tokens is None:
        return None
    sizes = vllm_v1_capture_sizes(seqs, tokens, _blackwell(hw))
    return {"decode_sizes": sizes, "step_sizes": sizes}


def _vllm_v0_graphs(policy: dict) -> dict | None:
    """vLLM 0.7.3: decode-only batches, sizes [1, 2, 4] + 8i up to the first at least max_num_seqs,
    every context at most max_seq_len_to_capture 8192 (config.py:3340-3400; worker/model_runner.py:762-818)."""
    seqs, tokens = _count(policy, "max_num_seqs", 256), _count(policy, "max_num_batched_tokens", 2048)
    if seqs is None or tokens is None:
        return None
    possible = [1, 2, 4] + [8 * i for i in range(1, 1025)]
    top = next((x for x in possible if x >= seqs), possible[-1])
    # (a size above the token budget is never reached: batchsim's steps stay within it)
    return {"decode_sizes": [x for x in possible if x <= top and x <= tokens], "decode_max_context": 8192}


def _sglang_graphs(policy: dict, hw, tp: int, model: str, running: int | None) -> dict | None:
    """SGLang 0.5.23: decode max_bs by GPU memory and TP (arg_groups/memory_hook.py:88-175), decode sizes
    (arg_groups/cuda_graph_hook.py:500-532); prefill (breakable graphs, on CUDA only) token buckets up to
    chunked_prefill_size (cuda_graph_hook.py:480-497; memory_hook.py:232-236), replayed only within 2x
    (model_executor/runner/prefill_cuda_graph_runner.py:158, 1414-1420). ``running``: the scenario's own
    max_num_seqs (SGLang's --max-running-requests), which caps the decode max_bs (memory_hook.py:182-188)."""
    gib = hw.memory_gib
    if gib < 20:
        max_bs = 8
    elif gib < 35:
        max_bs = 48 if tp < 4 else 160
    elif gib < 60:
        max_bs = 32 if tp < 4 else 160
    elif gib < 160:
        max_bs = 256 if tp < 4 else 512
    else:
        max_bs = 512
    if running is not None and max_bs > running:
        max_bs = running
    decode = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    decode = [b for b in decode if b <= max_bs]
    if max_bs not in decode:
        decode.append(max_bs)
    budget = _count(policy, "max_num_batched_tokens", 8192)
    if budget is None:
        return None
    chunk = min(budget, 4096) if "llama-2" in model.lower() else budget  # (memory_hook.py:258-263)
    prefill = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
               + list(range(1280, 4097, 256)) + list(range(4608, chunk + 1, 512)))
    prefill = [t for t in prefill if t <= chunk] if not _rocm(hw) else []  # (HIP: no prefill graphs)
    # (batchsim's decode steps share the chunk budget: a decode size above it is never reached)
    return {"decode_sizes": [b for b in sorted(decode) if b <= budget], "step_sizes": prefill, "step_max_padding": 2.0}


def _derive(kind: str, scenario, policy: dict, hw=None):
    """A knob the engine computes from the deployment (each as the preset's source states it)."""
    if kind == "vllm_v1_cuda_graphs":
        return _vllm_v1_graphs(policy, hw)
    if kind == "vllm_v0_cuda_graphs":
        return _vllm_v0_graphs(policy)
    if kind == "sglang_cuda_graphs":
        running = _count(user_policy(scenario), "max_num_seqs", 0)
        return _sglang_graphs(policy, hw, int(scenario.tensor_parallel_size), str(scenario.model), running)
    if kind == "max_model_len_at_least_2048":  # vLLM V0: without chunked prefill; with it (> 32K), 2048
        return 2048 if policy.get("name") == "chunked_prefill" else max(_context(scenario, policy), 2048)
    # SGLang: min(clamp(int(token_capacity / context_len * 512), 2048, 4096), token_capacity // 2),
    # capped at the chunk budget (batchsim's decode steps share it)
    from batchsim.app.runner import build_cost

    budget = _count(policy, "max_num_batched_tokens", 8192) or 8192  # (a bad value: its own check names it)
    util = policy.get("gpu_memory_utilization", 0.9)
    util = float(util) if isinstance(util, (int, float)) and not isinstance(util, bool) and 0 < util <= 1 else 0.9
    try:
        cap = build_cost(scenario).kv_capacity_tokens(util, max_num_batched_tokens=budget, max_num_seqs=2048)
    except InputError as e:
        if scenario.disaggregation is not None:  # (its pools run it: each resolves the preset for its own TP)
            raise _PerPool(f"resolved for each disaggregation pool (the top-level deployment: {e.message})") from None
        if e.where is None and "does not fit" in e.message:  # (the deployment's size: the scenario's field)
            raise InputError(e.message, "tensor_parallel_size") from None
        raise
    running = min(max(int(cap / _context(scenario, policy) * 512), 2048), 4096)
    return max(1, min(running, cap // 2, budget))


class _PerPool(Exception):
    """A derived knob a disaggregated scenario's top level cannot resolve (its deployment does not
    fit there) and its pools resolve for themselves; the text says why."""


def _value(knob: Knob, scenario, policy: dict, hw) -> tuple[bool, Any]:
    """(applies, value) of ``knob`` for this deployment; (False, why it is left out) otherwise."""
    if knob.when == "prefix_hashes" and not _has_prefix_hashes(scenario):
        return False, "the workload names no shared prefixes"
    if knob.derive is not None:
        try:
            return True, _derive(knob.derive, scenario, policy, hw)
        except _PerPool as e:
            return False, str(e)
    value = knob.value
    context = _context(scenario, policy) if any(r.min_context_tokens for r in knob.rules) else 0
    for rule in knob.rules:
        if (hw.memory_gib >= rule.min_memory_gib and not _named(hw, *rule.except_names)
                and context >= rule.min_context_tokens
                and (rule.when_policy is None or rule.when_policy == policy.get("name"))):
            value = rule.value
    return True, value


def _fields(policy_name: str) -> set[str] | None:
    from batchsim import policies

    try:
        cls = policies.policy_class(policy_name)
    except Exception:  # a plugin that does not load: the policy's own error comes later
        return None
    return set(cls.Config.model_fields)


def user_policy(scenario) -> dict:
    """The policy keys the scenario itself set: not those a preset filled before and that still hold
    the preset's value (a key a job or the user changed since is theirs)."""
    if "policy" not in scenario.model_fields_set:
        return {}
    filled = scenario.engine_preset_values
    out = {}
    for k, v in scenario.policy.items():
        if k in filled and isinstance(filled[k], dict) and isinstance(v, dict):  # a section: its own keys
            v = {sk: sv for sk, sv in v.items() if not (sk in filled[k] and filled[k][sk] == sv)}
            if not v:
                continue
        elif k in filled and filled[k] == v:
            continue
        out[k] = v
    return out


def _resolve(scenario) -> tuple[dict, dict, dict]:
    """(policy section in effect, per-knob report, the values the preset filled) of a scenario with
    an engine preset."""
    preset = load_preset(scenario.engine_preset)
    hw = _hardware(scenario)
    user = user_policy(scenario)
    name_knob = preset.policy.get("name")
    merged: dict[str, Any] = {}
    report: dict[str, dict] = {}
    filled: dict[str, Any] = {}
    if "name" in user:
        name = user["name"]
    else:
        _, name = _value(name_knob, scenario, user, hw) if name_knob else (True, "continuous")
        merged["name"] = filled["name"] = name
    accepted = _fields(name)
    report["name"] = {"value": name, "from": "scenario" if "name" in user else "preset",
                      "source": name_knob.source if name_knob else ""}
    for key, knob in preset.policy.items():
        if key == "name":
            continue
        if accepted is not None and key not in accepted:
            report[key] = {"value": None, "from": f"left out: policy {name!r} has no such knob",
                           "source": knob.source}
            continue
        ok, value = _value(knob, scenario, {**merged, **user}, hw)
        if key in user and ok and isinstance(value, dict) and isinstance(user[key], dict) and user[key]:
            # a section (cuda_graphs): the scenario's keys win, the preset fills the others
            merged[key] = {**value, **user[key]}
            filled[key] = {k: v for k, v in value.items() if k not in user[key]}
            report[key] = {"value": merged[key], "from": "scenario and preset", "preset_value": value,
                           "set_by_scenario": sorted(user[key]), "source": knob.source}
        elif key in user:
            report[key] = {"value": user[key], "from": "scenario", "preset_value": value if ok else None,
                           "source": knob.source}
        elif ok:
            merged[key] = filled[key] = value
            report[key] = {"value": value, "from": "preset", "source": knob.source}
        else:
            report[key] = {"value": None, "from": f"left out: {value}", "source": knob.source}
    merged.update({k: v for k, v in user.items() if not (isinstance(v, dict) and isinstance(merged.get(k), dict))})
    return merged, report, filled


def apply_preset(scenario):
    """``scenario`` with its preset's knobs in its policy section (its own keys win), resolved for
    its deployment; ``engine_preset_values`` records what the preset filled. The values an earlier
    preset filled and that nobody changed since are taken out again: all of them without a preset
    now, and those of another preset (``--set engine_preset=...``, ``plan --knob engine_preset=...``)
    that this one does not set. A recorded key that no preset sets was not written by batchsim: an error."""
    unknown = set(scenario.engine_preset_values) - {k for name in PRESETS for k in load_preset(name).policy}
    if unknown:
        raise InputError(f"names {', '.join(sorted(unknown))}, which no engine preset sets; this field is "
                         "batchsim's record of what the preset filled: delete it", "engine_preset_values")
    if scenario.engine_preset is None:
        user = user_policy(scenario)
        return scenario.model_copy(update={"policy": user if "name" in user else {"name": "continuous", **user},
                                           "engine_preset_values": {}})
    merged, _, filled = _resolve(scenario)
    return scenario.model_copy(update={"policy": merged, "engine_preset_values": filled})


def preset_report(scenario) -> dict | None:
    """What the scenario's engine preset set, knob by knob, with sources and notes (None without one)."""
    if scenario.engine_preset is None:
        return None
    preset = load_preset(scenario.engine_preset)
    _, knobs, _ = _resolve(scenario)
    return {"name": preset.name, "engine": preset.engine, "version": preset.version, "knobs": knobs,
            "notes": list(preset.notes)}


def _rule_text(r: Rule) -> str:
    when = []
    if r.min_memory_gib:
        when.append(f"from {r.min_memory_gib:g} GiB" + (f" except {', '.join(r.except_names)}" if r.except_names else ""))
    if r.min_context_tokens:
        when.append(f"from a {r.min_context_tokens}-token context")
    if r.when_policy:
        when.append(f"with `{r.when_policy}`")
    return f"`{r.value}` " + " and ".join(when)


def preset_markdown(name: str) -> str:
    """The preset's knobs, values, rules and sources, and its notes, as docs/fidelity.md shows them."""
    p = load_preset(name)
    lines = [f"### `{name}`: {p.engine} {p.version}", "", "| knob | value | source |", "| --- | --- | --- |"]
    for key, knob in p.policy.items():
        if knob.derive:
            value = f"derived: `{knob.derive}`"
        else:
            value = f"`{knob.value}`"
            if knob.rules:
                value += " (" + "; ".join(_rule_text(r) for r in knob.rules) + ")"
        if knob.when:
            value += " when the workload names shared prefixes"
        lines.append(f"| `{key}` | {value} | {knob.source} |")
    lines += ["", "Not modelled, or modelled differently:", ""] + [f"- {n}" for n in p.notes]
    return "\n".join(lines) + "\n"
