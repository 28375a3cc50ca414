"""Reading user YAML: PyYAML's safe loader, with duplicate keys refused.

PyYAML keeps the last of two equal keys in a mapping, so a scenario that set
``replicas`` twice silently ran with the second value. :func:`load_yaml`
raises :class:`DuplicateKeyError` (a ``yaml.YAMLError`` whose ``problem_mark``
is the second key) instead; callers report it like any other YAML error, with
the line. Keys merged in with ``<<: *anchor`` may be overridden, as YAML allows.
"""

from __future__ import annotations

import re
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


class _UniqueKeys:
    """The duplicate-key check, mixed into a safe loader."""

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


class _UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    pass


# NOTE: libyaml's parser (when PyYAML was built with it) feeds the same Python constructor and
# resolver, so a document loads to the same objects, ~10x faster (a hardware profile: 7 ms -> 0.7 ms,
# which every plan point reads). The two scanners differ on a few lexical points (a fuzz of 60,000
# documents found these): libyaml accepts tabs the pure-Python scanner refuses, refuses a directive
# line (``%FOO``) and a byte-order mark after the first character that it accepts, and cannot encode
# the lone surrogates Python makes of a non-UTF-8 command-line byte. A document with any of those is
# read by the pure-Python loader alone, so both read every document alike; and a document libyaml
# refuses is parsed again by the pure-Python loader, whose message (naming the token) is reported.
_FAST = type("_FastUniqueKeyLoader", (_UniqueKeys, yaml.CSafeLoader), {}) if yaml.__with_libyaml__ else None
_DIRECTIVE = re.compile("(?:^|[\n\r\x85\u2028\u2029])%")


def _load(text: str, loader_class) -> Any:
    loader = loader_class(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _libyaml_reads_alike(text: str) -> bool:
    """No tab, no directive line, no byte-order mark past the start, and encodable as UTF-8."""
    if "\t" in text or "\ufeff" in text[1:] or _DIRECTIVE.search(text):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, but a mapping with a repeated key is a :class:`DuplicateKeyError`."""
    if _FAST is None or not isinstance(text, str) or not _libyaml_reads_alike(text):
        return _load(text, _UniqueKeyLoader)
    try:
        return _load(text, _FAST)
    except yaml.YAMLError as fast_error:
        _load(text, _UniqueKeyLoader)  # (raises the same refusal, in the pure-Python loader's words)
        raise fast_error
