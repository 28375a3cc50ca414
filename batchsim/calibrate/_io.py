"""Reading catalog entries and user files into validated pydantic values.

Models and hardware profiles are both "a catalog name or a path": this module
resolves the name, reads YAML or JSON, and turns pydantic's validation errors
into one :class:`batchsim.sim.errors.InputError` that names the file, the field and the
offending value, which is what the CLI prints.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import reprlib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from batchsim.sim.errors import InputError
from batchsim.sim.safe_yaml import load_yaml

__all__ = ["catalog_names", "resolve", "read_mapping", "validate"]

M = TypeVar("M", bound=BaseModel)


def catalog_names(directory: Path) -> list[str]:
    """Sorted stems of the ``*.yaml`` files in a catalog directory."""
    return sorted(p.stem for p in directory.glob("*.yaml"))


def resolve(name_or_path: str, directory: Path, kind: str) -> Path:
    """A catalog entry's file, or an existing user file; else InputError."""
    names = catalog_names(directory)
    if name_or_path in names:
        return directory / f"{name_or_path}.yaml"
    path = Path(name_or_path).expanduser()
    if _is(path, "is_file"):
        return path
    if _is(path, "is_dir"):
        if (path / "config.json").is_file():
            return path / "config.json"
        expected = "a config.json file or a folder holding one" if kind == "model" else f"a {kind} YAML file"
        raise InputError(f"is a folder (resolved to {os.path.abspath(path)}); expected {expected}",
                         where=str(name_or_path))
    raise InputError(f"unknown {kind} {name_or_path!r}: not a catalog name ({', '.join(names)}) "
                     f"and no such file ({os.path.abspath(path)})")


def _is(path: Path, test: str) -> bool:
    """``path.is_file()`` / ``is_dir()``, False for a name the OS refuses (a NUL byte, too long)."""
    try:
        return getattr(path, test)()
    except (OSError, ValueError):
        return False


@functools.lru_cache(maxsize=64)
def _parsed_yaml(text: str) -> Any:
    """``load_yaml(text)``, once per text in a process: a plan point reads its hardware profile and
    model again (7 ms of pure-Python parsing for a profile); a refusal is raised every time."""
    return load_yaml(text)


def read_mapping(path: Path) -> dict[str, Any]:
    """Read a JSON (``.json``) or YAML file that must hold a mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror or e}", where=str(path)) from e
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text ({e.reason} at byte {e.start})", where=str(path)) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else copy.deepcopy(_parsed_yaml(text))
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON: {e}", where=str(path)) from None
    except yaml.YAMLError as e:  # one line: the problem and where, not PyYAML's multi-line context
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise InputError(f"not valid YAML: {getattr(e, 'problem', None) or e}", where=where) from None
    except RecursionError:
        raise InputError("nested too deeply; expected a mapping of fields", where=str(path)) from None
    if not isinstance(data, dict):
        raise InputError(f"expected a mapping at the top level, got {type(data).__name__}",
                         where=str(path))
    return data


def _lookup(data: Any, loc: tuple) -> Any:
    for key in loc:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _short(value: Any) -> str:
    """``repr(value)`` cut to one line (a YAML alias bomb can expand to 10^8 items)."""
    r = reprlib.Repr()
    r.maxstring = r.maxother = 80
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = 6
    r.maxlevel = 2
    text = r.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def validate(cls: type[M], data: dict[str, Any], where: str) -> M:
    """``cls.model_validate(data)`` with errors that name file, field and value."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(err.get("loc", ()))
        field = ".".join(str(p) for p in loc)
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        place = f"{where}: {field}" if field else where
        if err.get("type") == "missing":
            raise InputError(f"missing required field {field!r}", where=place) from None
        value = err.get("input", _lookup(data, loc))
        # NOTE: a cross-field check (loc empty) gets the whole file as input; its message names the values.
        shown = "" if isinstance(value, dict) else f" (got {_short(value)})"
        raise InputError(f"{msg}{shown}", where=place) from None
