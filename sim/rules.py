"""Which rules the compiled core implements, and whether the loaded code still states them.

The compiled core (sim/_core.c) is a second executor of the simulator's
rules: the recipe interpreter of the built-in policies (policies/step.py,
policies/padded.py), the engine's application of a plan (sim/engine.py), the
paged KV counter (sim/kv.py), the routers (sim/router.py) and the roofline
cost model's pricing (calibrate/). Those rules are stated once, in Python;
the core is written for one version of them. So that an edited rule is never
silently ignored, the core carries a table of that version's *rules
fingerprint*: one short hash per function or method of the modules in
:data:`RULE_MODULES`, over its source with docstrings, comments and blank
lines left out. ``sim.core`` compares the table with :func:`fingerprint` of
the code actually loaded (monkeypatched functions included) and runs a
scenario on the core only when they agree; otherwise the SimPy engine runs
it, and the run's summary names the functions that differ.

A developer who changes one of these functions changes the core's
interpreter to match (tests/test_core.py compares whole runs on both engines),
then refreshes the table: ``python -m sim.rules --update``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import re
import sys
import textwrap
import types
from pathlib import Path

__all__ = ["RULE_MODULES", "fingerprint", "differences", "c_table", "update_c_table"]

# The modules whose functions are rules the compiled core executes.
RULE_MODULES = (
    "policies.base", "policies.ordering", "policies.recipe", "policies.rules", "policies.step",
    "policies.padded", "sim.engine", "sim.kv", "sim.state", "sim.router",
    "calibrate.costmodel", "calibrate.curves", "calibrate.work",
)

_C_SOURCE = Path(__file__).with_name("_core.c")
_BEGIN = "/* BEGIN RULES FINGERPRINT (python -m sim.rules --update) */"
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
        elif isinstance(member, types.FunctionType):
            out.append((f".{name}", member))
    return out


def fingerprint(modules: tuple[str, ...] = RULE_MODULES) -> dict[str, str]:
    """``{"module.name[.method]": hash}`` of the rules as they are loaded now."""
    table: dict[str, str] = {}
    for modname in modules:
        mod = importlib.import_module(modname)
        for name, obj in sorted(vars(mod).items()):
            if isinstance(obj, dict):  # tables of strategies (QUEUE_ORDERS, VICTIM_RULES)
                items = [(f"[{k}]", v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))
                         if isinstance(v, types.FunctionType)]
            elif isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == modname:
                items = [("", obj)]
            else:
                continue
            for key, member in items:
                for suffix, fn in _functions(member):
                    text = _normalised(fn)
                    table[f"{modname}.{name}{key}{suffix}"] = hashlib.sha256(text.encode()).hexdigest()[:12]
    return table


def differences(expected: dict[str, str], actual: dict[str, str] | None = None) -> list[str]:
    """The names whose hash differs, or that only one of the tables has (sorted)."""
    actual = fingerprint() if actual is None else actual
    return sorted(k for k in set(expected) | set(actual) if expected.get(k) != actual.get(k))


def parse_table(text: str) -> dict[str, str]:
    """The ``name hash`` lines of a core's table as a dict."""
    return dict(line.split() for line in text.splitlines() if line.strip())


def c_table(table: dict[str, str] | None = None) -> str:
    """The block of sim/_core.c that holds the table (between its markers)."""
    table = fingerprint() if table is None else table
    rows = "\n".join(f'    "{k} {v}\\n"' for k, v in sorted(table.items()))
    return (f"{_BEGIN}\n/* The rules this core implements: one hash per function (sim/rules.py). */\n"
            f"static const char CORE_RULES[] =\n{rows};\n{_END}")


def update_c_table(path: Path = _C_SOURCE) -> bool:
    """Rewrite the table in sim/_core.c from the loaded rules; True if it changed."""
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
        print("usage: python -m sim.rules [--update]", file=sys.stderr)
        return 2
    for k, v in sorted(fingerprint().items()):
        print(v, k)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
