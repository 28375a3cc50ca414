"""The paged KV cache of one replica.

KV is allocated in blocks of ``block_size`` tokens, as in vLLM's
PagedAttention. The allocator only counts blocks per sequence: which physical
block holds what never matters to timing. Policies reach it through the
:class:`batchsim.sim.protocols.KVView` methods (``free_blocks``, ``blocks_needed``);
only the engine calls :meth:`grow` and :meth:`free`.
"""

from __future__ import annotations

from batchsim.sim.errors import InputError

__all__ = ["PagedKVCache", "KVExhausted", "blocks_for_tokens"]


class KVExhausted(RuntimeError):
    """A plan asked for more blocks than are free: a policy bug."""


def blocks_for_tokens(tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``tokens`` tokens (ceil division)."""
    return -(-tokens // block_size)


class PagedKVCache:
    """Counts KV blocks held per sequence against a fixed capacity."""

    prefix_caching = False

    def __init__(self, total_blocks: int, block_size: int) -> None:
        if total_blocks < 1:
            raise InputError(
                f"the KV cache has {total_blocks} blocks; at least 1 is needed "
                "(raise gpu_memory_utilization, use more tensor parallelism or a smaller model)"
            )
        self.block_size = block_size
        self.total_blocks = total_blocks
        self._held: dict[int, int] = {}
        self._used = 0
        self.peak_used = 0

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self._used

    @property
    def used_blocks(self) -> int:
        return self._used

    def held(self, rid: int) -> int:
        """Blocks held by sequence ``rid``."""
        return self._held.get(rid, 0)

    def blocks_held(self, seq) -> int:
        """Blocks ``seq`` holds (all freed when it is preempted or released)."""
        return self._held.get(seq.rid, 0)

    def blocks_needed(self, seq, total_tokens: int) -> int:
        """Extra blocks ``seq`` needs to hold ``total_tokens`` tokens."""
        need = -(-total_tokens // self.block_size) - self._held.get(seq.rid, 0)
        return need if need > 0 else 0

    def growth_needed(self, seqs, extra: int) -> int:
        """Extra blocks for every seq in ``seqs`` to grow by ``extra`` tokens
        (the sum of ``blocks_needed``; one call for a whole batch of decodes)."""
        held, bs, need = self._held, self.block_size, 0
        for s in seqs:
            n = -(-(s.num_computed + extra) // bs) - held.get(s.rid, 0)
            if n > 0:
                need += n
        return need

    def grow(self, rid: int, total_tokens: int) -> None:
        """Make ``rid`` hold at least ``total_tokens`` tokens of KV."""
        want = -(-total_tokens // self.block_size)
        have = self._held.get(rid, 0)
        if want <= have:
            return
        extra = want - have
        if extra > self.total_blocks - self._used:
            raise KVExhausted(
                f"sequence {rid} needs {extra} more KV blocks but only "
                f"{self.total_blocks - self._used} are free"
            )
        self._held[rid] = want
        self._used += extra
        if self._used > self.peak_used:
            self.peak_used = self._used

    def free(self, rid: int) -> int:
        """Release every block of ``rid``; returns how many were freed."""
        n = self._held.pop(rid, 0)
        self._used -= n
        return n

    # Prefix-caching hooks (see batchsim.sim.prefix); no-ops without a prefix cache.
    def peek(self, seq) -> None:
        """Before scheduling: count a waiting sequence's cached prefix."""

    def pin(self, seq) -> None:
        """On admission: take the cached prefix ``peek`` promised."""

    def register(self, seq) -> None:
        """After a step: cache the prompt units ``seq`` has computed."""

    def resident_units(self, hashes) -> int:
        """How many leading units of a prompt's prefix ``hashes`` this cache holds (what a
        cache-aware router reads: batchsim.sim.router)."""
        return 0

    cached_units = 0  # prefix units held, in use or evictable

    hit_rate = 0.0
