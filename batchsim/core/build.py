"""How the compiled core is built: flags and the source key (shared by setup.py and the loader).

This module imports nothing of batchsim, so setup.py can use it before the
package is installed.
"""

from __future__ import annotations

import hashlib

__all__ = ["GCC_FLAGS", "MSVC_FLAGS", "compile_args", "source_key"]

# NOTE: results must round exactly as Python's: no fused multiply-add, no fast math.
# NOTE: no SLP vectorization (gcc 12 turns it on at -O2): it read a step's sums, just written as
# 8-byte fields, as 16-byte vectors, a store-forwarding stall on every priced step (~1/3 of
# price_sums' time; a 300k-request static run 0.93x wall without it). It packs whole operations
# and never reorders a sum, so results are the same bits either way.
GCC_FLAGS = ["-O2", "-std=c99", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-fno-finite-math-only",
             "-fno-tree-slp-vectorize"]
MSVC_FLAGS = ["/O2", "/fp:precise"]


def compile_args(compiler_type: str) -> list[str]:
    """The compile flags for a distutils compiler type ('unix', 'msvc', 'mingw32', ...)."""
    return list(MSVC_FLAGS if compiler_type == "msvc" else GCC_FLAGS)


def source_key(source: bytes) -> str:
    """Which source a library was built from (compiled in as CORE_SOURCE_KEY)."""
    return hashlib.sha256(source).hexdigest()[:16]
