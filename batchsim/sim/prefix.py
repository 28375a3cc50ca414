"""Prefix caching: content-addressed KV blocks, shared across requests, LRU-evicted.

Like vLLM's automatic prefix caching, but counted in *units*: one unit is a
prefix block named by one entry of a request's ``prefix_hashes`` (Mooncake's
``hash_ids``, 512 tokens each), i.e. ``unit_tokens / block_size`` KV blocks.
Only full units of the prompt are cached (vLLM caches only full blocks); a
unit's key is its hash, which already identifies its whole prefix.

- A unit is registered when a sequence has computed all its tokens: its
  blocks stop being the sequence's private blocks and become the shared unit.
- When a waiting sequence is considered, the engine calls :meth:`peek`: the
  longest run of cached units at the start of its prompt becomes its
  ``num_computed`` (at least one prompt token is always left to compute), so
  policies see only the uncached tokens as pending.
- On admission :meth:`pin` takes a reference on those units; when the
  sequence is freed, units whose last reference goes become evictable and sit
  in an LRU list. Evictable blocks count as free; allocation evicts the least
  recently used units when truly free blocks run out.
"""

from __future__ import annotations

from collections import OrderedDict

from batchsim.sim.errors import InputError
from batchsim.sim.kv import KVExhausted, PagedKVCache

__all__ = ["PrefixKVCache"]


class PrefixKVCache(PagedKVCache):
    """A :class:`PagedKVCache` whose prompt units are shared and LRU-evicted."""

    prefix_caching = True

    def __init__(self, total_blocks: int, block_size: int, unit_tokens: int) -> None:
        super().__init__(total_blocks, block_size)
        if unit_tokens % block_size:
            raise InputError(f"block_size {block_size} must divide the prefix block of "
                             f"{unit_tokens} tokens", "policy.block_size")
        self.unit_tokens = unit_tokens
        self.unit_blocks = unit_tokens // block_size
        self._refs: dict[int, int] = {}  # unit key -> references (0 = evictable)
        self._lru: OrderedDict[int, None] = OrderedDict()  # evictable units, oldest first
        self._pinned: dict[int, list[int]] = {}  # rid -> unit keys it references
        self._evictable_blocks = 0
        self.lookups = 0  # prompt units looked up at admission
        self.hits = 0  # of which found in the cache

    # -- what policies see ----------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self._used + self._evictable_blocks

    @property
    def used_blocks(self) -> int:
        """Blocks in use by running sequences (cached, evictable units excluded)."""
        return self._used - self._evictable_blocks

    def _shared_blocks(self, rid: int) -> int:
        return len(self._pinned.get(rid, ())) * self.unit_blocks

    def blocks_held(self, seq) -> int:
        """Private blocks only: shared units stay cached when ``seq`` goes."""
        return self._held.get(seq.rid, 0)

    def blocks_needed(self, seq, total_tokens: int) -> int:
        have = self._held.get(seq.rid, 0) + self._shared_blocks(seq.rid)
        if seq.rid not in self._pinned and seq.num_computed and seq.prefix_hashes:
            # peeked hits on units in use by others cost nothing
            n = seq.num_computed // self.unit_tokens
            have += self.unit_blocks * sum(1 for k in seq.prefix_hashes[:n] if self._refs.get(k, 0) > 0)
        need = -(-total_tokens // self.block_size) - have
        return need if need > 0 else 0

    def growth_needed(self, seqs, extra: int) -> int:
        return sum(self.blocks_needed(s, s.num_computed + extra) for s in seqs)

    # -- engine hooks ---------------------------------------------------------
    def _cacheable_units(self, seq) -> int:
        """Full prompt units that may hit (one token is always recomputed)."""
        return min(len(seq.prefix_hashes), (seq.prompt_tokens - 1) // self.unit_tokens)

    def peek(self, seq) -> None:
        """Set a waiting sequence's ``num_computed`` to its cached prefix."""
        if not seq.prefix_hashes or seq.num_computed:
            return
        n, limit, refs = 0, self._cacheable_units(seq), self._refs
        hashes = seq.prefix_hashes
        while n < limit and hashes[n] in refs:
            n += 1
        seq.num_computed = n * self.unit_tokens

    def pin(self, seq) -> None:
        """Admit ``seq``: reference its cached units (they may have gone since peek)."""
        if not seq.prefix_hashes:
            return
        limit = self._cacheable_units(seq)
        want = seq.num_computed // self.unit_tokens
        keys = []
        for k in seq.prefix_hashes[:want]:
            r = self._refs.get(k)
            if r is None:
                break
            if r == 0:
                self._lru.pop(k)
                self._evictable_blocks -= self.unit_blocks
            self._refs[k] = r + 1
            keys.append(k)
        self.peak_used = max(self.peak_used, self.used_blocks)
        self._pinned[seq.rid] = keys
        self.lookups += limit
        self.hits += len(keys)
        seq.num_computed = len(keys) * self.unit_tokens
        seq.cached_tokens += seq.num_computed

    def register(self, seq) -> None:
        """After a step: cache the units of ``seq``'s prompt it has now computed."""
        keys = self._pinned.get(seq.rid)
        if keys is None or not seq.prefix_hashes:
            return
        n = min(seq.num_computed, seq.prompt_tokens) // self.unit_tokens
        n = min(n, len(seq.prefix_hashes))
        while len(keys) < n:
            k = seq.prefix_hashes[len(keys)]
            if k in self._refs or self._held.get(seq.rid, 0) < self.unit_blocks:
                return  # computed twice concurrently: keep ours private
            self._refs[k] = 1
            keys.append(k)
            self._held[seq.rid] -= self.unit_blocks
            # blocks move from private to shared: total used is unchanged

    # -- allocation -----------------------------------------------------------
    def grow(self, rid: int, total_tokens: int) -> None:
        want = -(-total_tokens // self.block_size) - self._shared_blocks(rid)
        have = self._held.get(rid, 0)
        if want <= have:
            return
        extra = want - have
        self._evict(extra - (self.total_blocks - self._used))
        self._held[rid] = want
        self._used += extra
        self.peak_used = max(self.peak_used, self.used_blocks)

    def _evict(self, blocks: int) -> None:
        while blocks > 0:
            if not self._lru:
                raise KVExhausted(f"{blocks} more KV blocks needed than free or evictable")
            k, _ = self._lru.popitem(last=False)
            del self._refs[k]
            self._evictable_blocks -= self.unit_blocks
            self._used -= self.unit_blocks
            blocks -= self.unit_blocks

    def free(self, rid: int) -> int:
        n = super().free(rid)
        for k in self._pinned.pop(rid, ()):
            r = self._refs[k] - 1
            self._refs[k] = r
            if r == 0:
                self._lru[k] = None
                self._evictable_blocks += self.unit_blocks
        return n

    def resident_units(self, hashes) -> int:
        n, refs = 0, self._refs
        for k in hashes:
            if k not in refs:
                break
            n += 1
        return n

    @property
    def cached_units(self) -> int:
        return len(self._refs)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0
