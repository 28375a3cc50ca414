"""Reading user YAML: PyYAML's safe loader, with duplicate keys refused.

PyYAML keeps the last of two equal keys in a mapping, so a scenario that set
``replicas`` twice silently ran with the second value. :func:`load_yaml`
raises :class:`DuplicateKeyError` (a ``yaml.YAMLError`` whose ``problem_mark``
is the second key) instead; callers report it like any other YAML error, with
the line. Keys merged in with ``<<: *anchor`` may be overridden, as YAML allows.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError

__all__ = ["DuplicateKeyError", "load_yaml"]

_MERGE = "tag:yaml.org,2002:merge"


class DuplicateKeyError(ConstructorError):
    """A mapping names the same key twice (``key``; ``problem_mark`` is the second one)."""

    def __init__(self, key: Any, first_line: int, mark) -> None:
        self.key = key
        super().__init__(None, None, f"duplicate key {key!r} (first at line {first_line}); expected each key once",
                         mark)


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # unhashable: the base class says so
                    continue
                if first is not key_node:
                    raise DuplicateKeyError(key, first.start_mark.line + 1, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, but a mapping with a repeated key is a :class:`DuplicateKeyError`."""
    loader = _UniqueKeyLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
