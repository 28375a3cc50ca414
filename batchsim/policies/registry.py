"""Find a policy class by name and build it from a validated config.

Three ways to name a policy, tried in order: a name registered with
:func:`register` (the four built-ins), an entry point in the
``batchsim.policies`` group (how an outside package ships its scheduler),
or a ``"package.module:ClassName"`` string (how a user tries one without
packaging it). Whatever the source, the spec is validated by the class's own
``Config`` model, and every failure is an :class:`batchsim.sim.errors.InputError`
that names ``policy.<field>``, the bad value and what was expected.
"""

from __future__ import annotations

import importlib
import math
from importlib.metadata import entry_points
from typing import Any, Callable, Mapping, TypeVar

from pydantic import ValidationError

from batchsim.policies.base import PolicyConfig
from batchsim.sim.errors import InputError, bool_as_number
from batchsim.sim.protocols import Policy

__all__ = ["ENTRY_POINT_GROUP", "register", "policy_names", "policy_class", "create_policy"]

ENTRY_POINT_GROUP = "batchsim.policies"

_REGISTRY: dict[str, type] = {}

T = TypeVar("T", bound=type)


def register(name: str) -> Callable[[T], T]:
    """Class decorator: make a policy class available as ``name``."""

    def deco(cls: T) -> T:
        old = _REGISTRY.get(name)
        if old is not None and old is not cls:
            raise ValueError(f"policy name {name!r} is already registered to {old.__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def policy_names() -> list[str]:
    """Every policy name usable in a spec: built-ins and installed plugins."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


def _load(name: str) -> type:
    """Resolve a name to a class, or raise InputError naming ``policy.name``."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    eps = _entry_points()
    try:
        if name in eps:
            return eps[name].load()
        if ":" in name:
            module, _, attr = name.partition(":")
            return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, SyntaxError, ValueError, TypeError) as err:
        # ValueError: an empty module name (":Cls"); TypeError: a relative one (".mod:Cls").
        raise InputError(f"cannot load policy {name!r}: {err}; expected 'package.module:ClassName'",
                         where="policy.name") from err
    raise InputError(
        f"unknown policy {name!r}; expected one of {', '.join(policy_names())} "
        "or 'package.module:ClassName'",
        where="policy.name",
    )


def policy_class(name: str) -> type:
    """The policy class a spec's ``name`` refers to (validated to look like a policy)."""
    cls = _load(name)
    config = getattr(cls, "Config", None)
    ok = isinstance(cls, type) and isinstance(config, type) and issubclass(config, PolicyConfig)
    if not ok or not callable(getattr(cls, "schedule", None)):
        raise InputError(
            f"{name!r} is not a batchsim policy: expected a class with a schedule(view) method "
            "and a Config subclass of batchsim.policies.base.PolicyConfig",
            where="policy.name",
        )
    return cls


def _validation_error(err: ValidationError, cfg: type[PolicyConfig], name: str) -> InputError:
    """One InputError naming each bad ``policy.<field>``, its value and what was expected."""
    found: list[tuple[str, str]] = []
    for e in err.errors(include_url=False):
        field = ".".join(str(p) for p in e["loc"])
        where = f"policy.{field}" if field else "policy"
        if e["type"] == "extra_forbidden":
            model, loc = cfg, list(e["loc"][:-1])
            while loc:  # a knob's own section (cuda_graphs): name that section's fields
                ann = model.model_fields[str(loc.pop(0))].annotation
                model = next((a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type)
                              and hasattr(a, "model_fields")), model)
            knobs = ", ".join(f for f in model.model_fields if f != "name")
            what = f"policy {name!r}" if model is cfg else f"{'.'.join(map(str, e['loc'][:-1]))} of policy {name!r}"
            found.append((where, f"unknown knob for {what} (got {e['input']!r}); expected one of {knobs}"))
        elif e["type"] == "value_error":  # our own checks: the message names the values
            found.append((where, e["msg"].removeprefix("Value error, ")))
        else:
            found.append((where, f"got {e['input']!r}; expected {_expected(e['msg'])}"))
    (where, text), rest = found[0], found[1:]
    return InputError("; ".join([text] + [f"{w}: {t}" for w, t in rest]), where=where)


def _expected(msg: str) -> str:
    """Turn pydantic's 'Input should be X' into 'X'."""
    for prefix in ("Input should be ", "input should be "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg


def create_policy(spec: Mapping[str, Any]) -> Policy:
    """Build a policy from a spec such as ``{"name": "continuous", "max_num_seqs": 64}``."""
    if not isinstance(spec, Mapping):
        raise InputError(f"expected a mapping with a 'name', got {spec!r}", where="policy")
    name = spec.get("name")
    if not isinstance(name, str) or not name or len(name) > 200:
        shown = f"{name[:60]!r}... ({len(name)} characters)" if isinstance(name, str) and name else repr(name)
        raise InputError(f"missing or invalid name {shown}; expected one of {', '.join(policy_names())}",
                         where="policy.name")
    cls = policy_class(name)
    for key, value in spec.items():
        # NOTE: an infinite timeout_s or max_queue_delay_s idled the replica until t = inf
        # and the run ended in a non-finite duration. (Here rather than in each Config,
        # so that outside policies get the check too.)
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"got {value!r}; expected a finite number", where=f"policy.{key}")
    try:
        config = cls.Config.model_validate(dict(spec))
    except ValidationError as err:
        raise _validation_error(err, cls.Config, name) from None
    for key, value in spec.items():
        # NOTE: pydantic reads true as 1: `max_num_seqs: true` ran one sequence at a time.
        kind = bool_as_number(value, getattr(config, key, value))
        if kind is not None:
            raise InputError(f"got {value!r}; expected {kind}, not a boolean", where=f"policy.{key}")
    return cls(config)
