"""Request state owned by the engine.

A :class:`Seq` is what policies see as a :class:`batchsim.sim.protocols.SeqView`
(read-only by convention) and what the engine mutates when it applies a
plan. It also carries the lifecycle timestamps that become a request record.
"""

from __future__ import annotations

__all__ = ["Seq", "COMPLETED", "REJECTED", "UNFINISHED"]

COMPLETED = "completed"
REJECTED = "rejected"
UNFINISHED = "unfinished"


class Seq:
    """One request's progress through a replica."""

    # NOTE: __slots__ keeps a million live requests at ~200 bytes each.
    __slots__ = (
        "rid", "arrival", "prompt_tokens", "output_tokens", "max_tokens",
        "num_tokens", "num_computed", "num_generated", "num_preemptions",
        "finished", "replica", "admitted", "first_token", "last_token",
        "completion", "max_itl", "status", "reason", "cached_tokens",
        "prefix_hashes", "is_running", "order", "run",
    )

    def __init__(self, rid: int, arrival: float, prompt_tokens: int, output_tokens: int,
                 prefix_hashes: tuple[int, ...] | None = None) -> None:
        self.rid = rid
        self.arrival = arrival
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.max_tokens = output_tokens
        self.num_tokens = prompt_tokens
        self.num_computed = 0
        self.num_generated = 0
        self.num_preemptions = 0
        self.finished = False
        self.replica = -1
        self.admitted: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.completion: float | None = None
        self.max_itl = 0.0
        self.status = UNFINISHED
        self.reason = ""
        self.cached_tokens = 0
        self.prefix_hashes = prefix_hashes
        self.is_running = False
        self.order = -1  # admissions to running so far on its replica when it was (last) admitted
        self.run: list | None = None  # its open run of tokens [replica, start, end, entry] (batchsim.sim.itl)

    @property
    def pending(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def in_prefill(self) -> bool:
        return self.num_generated == 0 or self.num_tokens - self.num_computed > 1

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Seq(rid={self.rid}, computed={self.num_computed}/{self.num_tokens}, "
                f"generated={self.num_generated}/{self.output_tokens})")
