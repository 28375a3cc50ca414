"""Which rules the compiled core implements, and whether the loaded code still states them.

The compiled core (batchsim/core/_core.c) is a second executor of the simulator's
rules: the recipe interpreter of the built-in policies (batchsim/policies/step.py,
batchsim/policies/padded.py), the engine's application of a plan (batchsim/sim/engine.py), the
paged KV counter (batchsim/sim/kv.py), the routers (batchsim/sim/router.py) and the roofline
cost model's pricing (batchsim/calibrate/). Those rules are stated once, in Python;
the core is written for one version of them. So that an edited rule is never
silently ignored, the core carries a table of that version's *rules
fingerprint* (:func:`fingerprint`): for each module of :data:`RULE_MODULES`
a hash of its file (blank and comment-only lines left out), of each
module-level constant, of which function each strategy-table entry is, and
of each function and method by its own source (docstrings left out).
``batchsim.core`` runs a scenario on the core only when the loaded code agrees
with the table; otherwise the SimPy engine runs it, and the run's summary
names what differs. The check is cheap (:func:`quick_fingerprint`, a few
ms: the files, the constants, and that every function is still the one its
module's file defines, so a monkeypatch counts); the per-function hashes
are computed only to name what differs.

A developer who changes one of these functions changes the core's
interpreter to match (tests/test_core.py compares whole runs on both engines),
then refreshes the table: ``python -m batchsim.core.rules --update``.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import importlib
import inspect
import re
import sys
import sysconfig
import textwrap
import types
from pathlib import Path

__all__ = ["RULE_MODULES", "fingerprint", "quick_fingerprint", "differences", "c_table", "update_c_table"]

# The modules whose functions are rules the compiled core executes.
RULE_MODULES = (
    "batchsim.policies.base", "batchsim.policies.ordering", "batchsim.policies.recipe", "batchsim.policies.rules", "batchsim.policies.step",
    "batchsim.policies.padded", "batchsim.sim.engine", "batchsim.sim.kv", "batchsim.sim.state", "batchsim.sim.router", "batchsim.sim.types",
    "batchsim.calibrate.costmodel", "batchsim.calibrate.curves", "batchsim.calibrate.work", "batchsim.sim.frontend",
)

# Modules that wire the rules together for the SimPy engine (the runner builds replicas, caches and
# routers from these names): their bindings must be the rules' own, whatever else changes in them.
WIRING_MODULES = ("batchsim.app.runner",)

_C_SOURCE = Path(__file__).with_name("_core.c")
_BEGIN = "/* BEGIN RULES FINGERPRINT (python -m batchsim.core.rules --update) */"
_END = "/* END RULES FINGERPRINT */"


def _normalised(fn) -> str:
    """``fn``'s source without docstrings, comments or blank lines ('?' when it has none)."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return "?"
    lines = src.splitlines()
    try:
        tree = ast.parse(src)
    except SyntaxError:  # pragma: no cover - a lambda inside an expression
        return "\n".join(line.rstrip() for line in lines)
    drop: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            drop.update(range(body[0].lineno, body[0].end_lineno + 1))
    kept = [line.rstrip() for i, line in enumerate(lines, 1)
            if i not in drop and line.strip() and not line.lstrip().startswith("#")]
    return "\n".join(kept)


def _functions(obj) -> list[tuple[str, object]]:
    """(name, function) for a function, or for each function a class defines."""
    if isinstance(obj, types.FunctionType):
        return [("", obj)]
    out = []
    for name, member in sorted(vars(obj).items()):
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            out += [(f".{name}.{part}", f) for part, f in (("get", member.fget), ("set", member.fset)) if f]
        elif isinstance(member, (types.FunctionType, functools.partial, functools.partialmethod)):
            out.append((f".{name}", member))
    return out


def _rules_of(mod) -> list[tuple[str, object]]:
    """``(name, function)`` for every function the module defines, its classes' methods and its
    strategy tables' entries (``QUEUE_ORDERS[fcfs]``), as loaded now."""
    modname = mod.__name__
    out = []
    for name, obj in sorted(vars(mod).items()):
        if isinstance(obj, dict):  # tables of strategies (QUEUE_ORDERS, VICTIM_RULES)
            items = [(f"[{k}]", v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))
                     if isinstance(v, types.FunctionType)]
        elif isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == modname:
            items = [("", obj)]
        else:
            continue
        for key, member in items:
            out += [(f"{modname}.{name}{key}{suffix}", fn) for suffix, fn in _functions(member)]
    return out


_SIMPLE = (int, float, str, bool, type(None))


def _library_paths() -> tuple[str, ...]:
    """Where libraries live: the standard library, site-packages (the interpreter's, the user's,
    and any other on sys.path, e.g. through PYTHONPATH); never the current folder."""
    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        import site
        paths.add(site.getusersitepackages())
    except (ImportError, AttributeError):  # pragma: no cover - embedded interpreters
        pass
    paths.update(p for p in sys.path if p and os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages"))
    return tuple(sorted(str(Path(p)) + os.sep for p in paths if p))


_LIBRARY_PATHS = _library_paths()


def _constant(value) -> bool:
    if isinstance(value, _SIMPLE):
        return True
    return isinstance(value, (tuple, frozenset)) and all(isinstance(v, _SIMPLE) for v in value)


def _file_text(path: str) -> str:
    """A module file's lines less blank and comment-only ones."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return "?"
    return "\n".join(line.rstrip() for line in lines if line.strip() and not line.lstrip().startswith("#"))


_FILE_HASHES: dict[str, tuple[tuple[int, int], str]] = {}


def _file_hash(path: str) -> str:
    """``_short(_file_text(path))``, read again only when the file's size or modification time
    changed (every simulation checks the rules: a plan's points, a sweep's)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return _short(_file_text(path))
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _FILE_HASHES.get(path)
    if hit is None or hit[0] != stamp:
        hit = _FILE_HASHES[path] = (stamp, _short(_file_text(path)))
    return hit[1]


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def quick_fingerprint(modules: tuple[str, ...] = RULE_MODULES) -> tuple[dict[str, str], list[str]]:
    """The cheap part of :func:`fingerprint` (each module's file, its constants) and the names of
    functions that are not the ones their module's file defines (monkeypatched), in a few ms."""
    table: dict[str, str] = {}
    patched: list[str] = []
    for modname in modules:
        mod = importlib.import_module(modname)
        path = getattr(mod, "__file__", None) or "?"
        table[f"file:{modname}"] = _file_hash(path)
        for name, value in sorted(vars(mod).items()):
            if name.startswith("__"):
                continue
            if _constant(value):
                table[f"const:{modname}.{name}"] = _short(repr(value))
                continue
            origin = _origin(value)  # imported names and aliases too (batchsim.policies.step.held_blocks)
            if origin == "?":
                patched.append(f"{modname}.{name}")
            elif origin is not None:
                table[f"bind:{modname}.{name}"] = _short(origin)
        for name, fn in _rules_of(mod):
            qual = name[len(modname) + 1:]
            if "[" in qual:  # a strategy table's entry: which function it is
                table[f"entry:{name}"] = _short(f"{fn.__module__}.{fn.__qualname__}")
            elif not _as_defined(fn, path, qual.removesuffix(".get").removesuffix(".set")):
                patched.append(name)
    for modname in WIRING_MODULES:
        for name, value in sorted(vars(importlib.import_module(modname)).items()):
            origin = _origin(value)
            home = sys.modules.get(getattr(value, "__module__", None) or "")
            if origin == "?" or (origin is not None and getattr(home, getattr(value, "__name__", ""), None)
                                 is not value):
                patched.append(f"{modname}.{name}")
    return table, patched


# the batchsim package folder (installed or a checkout), as imported and as resolved
_OURS = tuple({str(p) + os.sep for p in (Path(__file__).parents[1], Path(__file__).resolve().parents[1])})


def _library(where: str) -> bool:
    """Code of a library, not of batchsim (whose own files may be installed among the libraries)."""
    if where.startswith(_OURS):
        return False
    return where == "<builtin>" or any(where.startswith(p) for p in _LIBRARY_PATHS)


def _origin(obj) -> str | None:
    """What a module-level name is bound to: ``module.qualname`` for the project's own functions
    and classes, None for a library's (numpy, typing, the standard library, builtins), or '?' for
    anything else (a function of a test, a notebook, ``python -c``, a partial: a monkeypatch)."""
    if isinstance(obj, types.ModuleType) or not callable(obj):
        return None
    if isinstance(obj, functools.partial):
        return "?"
    if isinstance(obj, types.FunctionType):
        where = obj.__code__.co_filename
    elif isinstance(obj, type):
        where = getattr(sys.modules.get(obj.__module__), "__file__", None) or "<builtin>"
    else:  # a C function, a bound method or a library's callable object (np.add.reduce, typing.Callable)
        where = getattr(sys.modules.get(type(obj).__module__), "__file__", None) or "<builtin>"
        return None if _library(where) else "?"
    if where.startswith(_OURS):
        return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
    return None if _library(where) else "?"


def _generated(fn) -> bool:
    """A method made by a library from declarations (dataclass, NamedTuple, pydantic): the
    declarations are in the module's file, which is hashed whole."""
    if not isinstance(fn, types.FunctionType):
        return False
    where = fn.__code__.co_filename
    return where.startswith("<") or _library(where)


def _as_defined(fn, path: str, qual: str) -> bool:
    """Whether ``fn`` is the function the module's file defines under ``qual`` (not a monkeypatch).

    A method a library made from the class's declarations is accepted too: a dataclass's or
    NamedTuple's (exec'd, named ``Class.method``) or one a library built in a closure (pydantic's
    ``__hash__``); a lambda, an exec'd or REPL function, a partial or any function of another
    file under the method's name is a patch.
    """
    if not isinstance(fn, types.FunctionType):
        return False
    code = fn.__code__
    where = code.co_filename
    if where == path:
        return code.co_name == fn.__name__ and (fn.__qualname__ == qual or "<locals>" in fn.__qualname__)
    if where.startswith("<"):
        return fn.__qualname__ == qual and fn.__module__ != "__main__"
    if _library(where):
        return fn.__qualname__ == qual or ("<locals>" in fn.__qualname__
                                           and not str(fn.__module__).startswith(("batchsim", "__main__")))
    return False


def fingerprint(modules: tuple[str, ...] = RULE_MODULES) -> dict[str, str]:
    """``{name: hash}`` of the rules as they are loaded now: each module file and constant
    (:func:`quick_fingerprint`) and each function and method, by its own source."""
    table, _ = quick_fingerprint(modules)
    for modname in modules:
        for name, fn in _rules_of(importlib.import_module(modname)):
            if not _generated(fn):
                table[name] = _short(_normalised(fn))
    return table


def differences(expected: dict[str, str]) -> list[str]:
    """What differs between the loaded rules and ``expected`` (a core's table), sorted: the
    functions whose source differs or that were replaced, else the modules or constants."""
    quick, patched = quick_fingerprint()
    if not patched and all(expected.get(k) == v for k, v in quick.items()) and \
            not any(k.startswith(("file:", "const:", "entry:", "bind:")) and k not in quick for k in expected):
        return []
    actual = fingerprint()
    diff = sorted(k for k in set(expected) | set(actual) if expected.get(k) != actual.get(k))
    funcs = sorted(set(patched) | {k for k in diff if ":" not in k})
    return funcs or diff


def parse_table(text: str) -> dict[str, str]:
    """The ``name hash`` lines of a core's table as a dict."""
    return dict(line.split() for line in text.splitlines() if line.strip())


def c_table(table: dict[str, str] | None = None) -> str:
    """The block of batchsim/core/_core.c that holds the table (between its markers)."""
    table = fingerprint() if table is None else table
    rows = "\n".join(f'    "{k} {v}\\n"' for k, v in sorted(table.items()))
    return (f"{_BEGIN}\n/* The rules this core implements: one hash per function (batchsim/core/rules.py). */\n"
            f"static const char CORE_RULES[] =\n{rows};\n{_END}")


def update_c_table(path: Path = _C_SOURCE) -> bool:
    """Rewrite the table in batchsim/core/_core.c from the loaded rules; True if it changed."""
    src = path.read_text()
    pattern = re.compile(re.escape(_BEGIN) + ".*?" + re.escape(_END), re.S)
    if not pattern.search(src):
        raise RuntimeError(f"{path}: no rules table markers")
    new = pattern.sub(lambda _m: c_table(), src)
    if new == src:
        return False
    path.write_text(new)
    return True


def main(argv: list[str]) -> int:
    if argv == ["--update"]:
        print("updated" if update_c_table() else "unchanged", _C_SOURCE)
        return 0
    if argv:
        print("usage: python -m batchsim.core.rules [--update]", file=sys.stderr)
        return 2
    try:
        for k, v in sorted(fingerprint().items()):
            print(v, k)
    except BrokenPipeError:  # (piped into head)
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
