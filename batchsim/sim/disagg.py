"""Disaggregated serving: a prefill pool and a decode pool, the prompt's KV moved between them on a link.

The mechanism, as the engines that ship it run it (docs/disaggregation.md gives each source):

1. A request is routed to a **prefill replica** (the prefill pool's router) and runs there as a
   request for one output token (vLLM's proxy sends it with ``max_tokens: 1``): the pool's own
   policy schedules it, with its own KV cache, budget and preemption: the ordinary
   :class:`~batchsim.sim.engine.Replica`.
2. When its prompt is computed and that token sampled, the prefill replica hands it off
   (``Replica.handoff``): its KV **stays allocated there** until the transfer has read it (vLLM's
   NixlConnector delays freeing the blocks until the decode side's read is done).
3. The decode pool's router picks a **decode replica** then (vLLM's proxy calls the decode server
   once the prefill call returns). That replica's blocks for the request are allocated first come
   first served as they are free (SGLang's ``DecodePreallocQueue``; vLLM's ``WAITING_FOR_REMOTE_KVS``
   request holds its blocks while the KV arrives): enough for the prompt's KV and the first decode
   step, so a transferred request can always take that step.
4. The **link** (:class:`KVLink`) moves ``prompt_tokens x kv_bytes_per_token`` bytes: each replica
   has ``tensor_parallel_size`` NICs of the link's per-GPU bandwidth, a transfer holds its source's
   egress and its destination's ingress, first come first served, at the slower of the two, and
   arrives ``latency_s`` after its last byte leaves. ``per_request``: it starts when the prompt is
   done and the decode blocks are held (vLLM's NIXL read). ``per_layer``: a layer's KV leaves as the
   layer finishes, so the transfer can start when the prompt's last prefill step does and ends one
   layer's worth after the prefill at the earliest (Splitwise). ``per_chunk`` (SGLang, with ``pairing: at_arrival``): each prefill chunk's whole
   blocks leave when its step ends (``send_kv_chunk``), the rest with the prompt's last step. The
   prefill replica's blocks are freed at the transfer's end.
5. The request joins the decode replica's waiting queue holding its KV, and that pool's policy
   runs it like any other. ``first_token: prefill`` (SGLang): the token sampled on the prefill
   replica travels with the KV and reaches the client when the transfer ends and the decode replica's
   frontend has streamed it (:func:`~batchsim.sim.frontend.delivered_at`, as for the tokens its steps
   emit), so TTFT = queue + prefill + transfer (+ that frontend's out time when priced); the decode
   replica continues from the second token. ``first_token: decode``
   (vLLM's NixlConnector): the decode replica recomputes the last prompt token (its
   ``num_computed_tokens`` is the prompt less one) and samples the first token itself.

``pairing: at_arrival`` (SGLang) changes steps 1-3: the router picks the decode replica as the request
arrives (``mini_lb.select_pair`` posts it to both servers at once), the decode replica pre-allocates the
prompt's KV first come first served, keeping ``reserved_tokens`` free for every request it runs, holds in
its queue or has pre-allocated (``DecodePreallocQueue.pop_preallocated``, ``_allocatable_tokens``), and
only then may the prefill start (the prefill server's bootstrap queue holds the request until the decode
side is ready: ``prefill.py``, "Life cycle of a request"); the transfer starts when the prefill ends.

A preempted request on the decode pool recomputes there (both engines). KV is held on the prefill
side from admission to the transfer's end, on the decode side from allocation to completion.
The compiled core has no transfer: a disaggregated scenario runs on this SimPy engine, and the run
says so.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import simpy

from batchsim.sim.engine import Cluster, Replica, queue_full
from batchsim.sim.frontend import delivered_at
from batchsim.sim.state import COMPLETED, REJECTED, Seq
from batchsim.sim.types import Workload

__all__ = ["LinkSpec", "KVLink", "DisaggCluster", "Livelock", "TRANSFER_MODES", "FIRST_TOKEN", "PAIRING",
           "TRANSFER_COLUMNS", "LIVELOCK_PREEMPTIONS"]

LIVELOCK_PREEMPTIONS = 1000
"""A decode-pool request preempted this many times is in a livelock (module docstring): the run stops."""


class Livelock(RuntimeError):
    """A decode replica can no longer make progress however long it runs (:meth:`DisaggCluster.stalled`).
    (One message argument: SimPy re-raises a process's exception as ``type(e)(*e.args)``.)"""

TRANSFER_MODES = ("per_request", "per_layer", "per_chunk")
FIRST_TOKEN = ("prefill", "decode")
PAIRING = ("after_prefill", "at_arrival")

# The per-request columns a disaggregated run adds (seconds; NaN where the request never got there)
TRANSFER_COLUMNS = ("prefill_replica", "decode_blocks", "prefill_admitted", "prefill_end", "transfer_start",
                    "transfer_end", "decode_admitted", "kv_transfer_bytes")
# (decode_blocks: when the decode replica took the request's blocks: after the prefill with pairing
# after_prefill, before it with at_arrival)


@dataclass(frozen=True)
class LinkSpec:
    """The KV-transfer link: ``bandwidth`` bytes/s per GPU (each GPU its own NIC), ``latency_s``
    per transfer, ``mode`` per_request | per_layer | per_chunk, ``layers`` (per_layer: the model's)."""

    bandwidth: float
    latency_s: float
    mode: str = "per_request"
    layers: int = 1

    def __post_init__(self) -> None:
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise ValueError(f"link bandwidth must be positive, got {self.bandwidth}")
        if self.latency_s < 0 or self.mode not in TRANSFER_MODES or self.layers < 1:
            raise ValueError(f"bad link: latency {self.latency_s}, mode {self.mode!r}, layers {self.layers}")


class KVLink:
    """Each replica's NICs as one first-come-first-served endpoint: the prefill replicas' egress,
    the decode replicas' ingress. Busy time per endpoint is kept for the link's utilization."""

    def __init__(self, spec: LinkSpec, prefill_gpus: Sequence[int], decode_gpus: Sequence[int]) -> None:
        self.spec = spec
        self.out_bw = [spec.bandwidth * g for g in prefill_gpus]
        self.in_bw = [spec.bandwidth * g for g in decode_gpus]
        self.out_free = [-math.inf] * len(prefill_gpus)
        self.in_free = [-math.inf] * len(decode_gpus)
        self.out_busy = [0.0] * len(prefill_gpus)
        self.in_busy = [0.0] * len(decode_gpus)
        self.transfers = 0
        self.bytes = 0.0

    def transfer(self, src: int, dst: int, nbytes: float, ready: float,
                 overlap: tuple[float, float] | None = None, last: bool = True) -> tuple[float, float]:
        """Book a transfer of ``nbytes`` from prefill replica ``src`` to decode replica ``dst``, the
        KV ready to send at ``ready``; ``overlap`` (per_layer: the prompt's last prefill step's
        start and end) lets it start with that step. ``last``: False for a per_chunk send before the
        prompt's last one (its bytes and busy time count; the request's transfer is the last send's).
        Returns (start, arrival)."""
        spec = self.spec
        wire = nbytes / min(self.out_bw[src], self.in_bw[dst])
        free = max(self.out_free[src], self.in_free[dst])
        if overlap is not None and spec.mode == "per_layer":
            begin, end = overlap
            start = max(begin, free)
            # (layer l's KV leaves once layer l is computed: the last layer's after the step ends)
            done = max(start + wire, end + wire / spec.layers)
        else:
            start = max(ready, free)
            done = start + wire
        self.out_free[src] = self.in_free[dst] = done
        self.out_busy[src] += done - start
        self.in_busy[dst] += done - start
        self.transfers += int(last)
        self.bytes += nbytes
        return start, done + spec.latency_s


class _RouterView:
    """A replica as its pool's router sees it: its load counts the requests routed to it that are not
    in its own queue yet (``inbound``: a decode replica's on their way, waiting for blocks or on the
    link; a prefill replica's, with pairing at_arrival, waiting for their decode blocks in its
    bootstrap queue), and ``index`` is its place in the pool. ``backlog`` is the requests of
    ``inbound`` that count as waiting there (those not holding its blocks yet)."""

    __slots__ = ("replica", "index", "inbound", "backlog")

    def __init__(self, replica: Replica, index: int, backlog: Sequence | None = None) -> None:
        self.replica, self.index, self.inbound, self.backlog = replica, index, 0, backlog

    @property
    def outstanding(self) -> int:
        return self.replica.outstanding + self.inbound

    @property
    def kv(self):
        return self.replica.kv

    @property
    def queued(self) -> int:
        return self.replica.queued + (len(self.backlog) if self.backlog is not None else 0)


class DisaggCluster(Cluster):
    """Prefill replicas (``replicas``, behind ``route``) and decode replicas (``decode``, behind
    ``decode_route``), with ``link`` between them; ``kv_bytes_per_token`` of the model; ``first_token``
    prefill | decode (module docstring). Arrivals, closed-loop clients and queue limits are the
    colocated :class:`~batchsim.sim.engine.Cluster`'s, on the prefill pool."""

    def __init__(self, env: simpy.Environment, replicas: Sequence[Replica], route: Callable,
                 decode: Sequence[Replica], decode_route: Callable, link: KVLink, workload: Workload,
                 kv_bytes_per_token: float, first_token: str = "prefill", max_queue_len: int | None = None,
                 pairing: str = "after_prefill", reserved_tokens: int = 0) -> None:
        if first_token not in FIRST_TOKEN:
            raise ValueError(f"first_token must be one of {FIRST_TOKEN}, got {first_token!r}")
        if pairing not in PAIRING or reserved_tokens < 0:
            raise ValueError(f"pairing must be one of {PAIRING} and reserved_tokens >= 0, got {pairing!r}, "
                             f"{reserved_tokens}")
        if link.spec.mode == "per_chunk" and pairing != "at_arrival":
            raise ValueError("per_chunk transfers need pairing at_arrival: a chunk is sent to decode blocks "
                             "allocated before the prefill")
        self.pairing, self.reserved_tokens = pairing, int(reserved_tokens)
        self.sent_tokens: dict[int, int] = {}  # per_chunk: rid -> prompt tokens already sent
        self.first_send: dict[int, float] = {}  # per_chunk: rid -> when its first chunk left
        self.decode = list(decode)
        self.decode_route, self.link = decode_route, link
        self.kv_bytes_per_token, self.first_token = float(kv_bytes_per_token), first_token
        self.alloc: list[deque] = [deque() for _ in self.decode]  # (waiting for decode blocks)
        self._pools = [_RouterView(r, i, q) for i, (r, q) in enumerate(zip(self.decode, self.alloc))]
        # (at_arrival: a prefill replica's router counts the requests in its bootstrap queue)
        self._prefill_views = [_RouterView(r, i) for i, r in enumerate(replicas)] if pairing == "at_arrival" else None
        self._prefill_pos = {r.index: i for i, r in enumerate(replicas)}
        n = len(workload)
        self.seq: dict[int, Seq] = {}  # rid -> the request's record, while it is on its way
        self.bound = [0] * len(self.decode)  # at_arrival: requests holding decode blocks, not yet arrived there
        self.paired: dict[int, int] = {}  # at_arrival: rid -> its decode replica's place in the pool
        self.in_transit: set[int] = set()
        self.flying = [0] * len(self.decode)  # transfers on the link to each decode replica
        self.livelocked: list[int] = []
        self.col = {c: np.full(n, np.nan) for c in TRANSFER_COLUMNS}
        self.col["prefill_replica"] = np.full(n, -1, dtype=np.int64)
        super().__init__(env, replicas, route, workload, max_queue_len)
        for r in replicas:
            r.handoff = self._handoff
            r.on_done = self._prefill_ended
            r.counted = "prefill pool: prompt+first token"  # (it runs a request for one token)
            if link.spec.mode == "per_chunk":
                r.after_plan = self._send_chunks
        for r in self.decode:
            r.after_plan = self._take_blocks
            r.on_done = self._end if workload.closed is not None else None

    # -- arrival: the request and its prefill ---------------------------------------------------
    def _send(self, rid: int, t: float) -> Seq:
        w = self.workload
        hashes = w.prefix_hashes
        prompt, output = self._prompt[rid], self._output[rid]
        seq = Seq(rid, t, prompt, output, hashes[rid] if hashes is not None else None)
        self.requests.append(seq)
        views = self._prefill_views
        pos = self.route(self.replicas if views is None else views, seq)
        replica = self.replicas[pos]
        seq.replica = replica.index
        self.col["prefill_replica"][rid] = replica.index
        # (what the decode pool can never hold is refused at once, by the engine's own rule)
        why = next((w for r in self.decode if (w := r.refusal(seq)) is not None), None)
        if why is not None:
            return self._refuse(seq, replica, why)
        # (at_arrival: the requests in its bootstrap queue wait there too)
        queued = replica.queued + (views[pos].inbound if views is not None else 0)
        if self.max_queue_len is not None and queued >= self.max_queue_len:
            return self._refuse(seq, replica, queue_full(self.max_queue_len))
        self.seq[rid] = seq
        if self.pairing == "at_arrival":  # (the decode side first: the prefill waits for its blocks)
            pf = Seq(rid, t, prompt, 1, seq.prefix_hashes)
            if replica.refusal(pf) is not None:  # (refused there at once, by the prefill pool's own rule)
                replica.enqueue(pf)
                return seq
            views[pos].inbound += 1  # (in the prefill replica's bootstrap queue)
            pos = self.decode_route(self._pools, seq)
            self._pools[pos].inbound += 1
            self.paired[rid] = pos
            self.in_transit.add(rid)
            self.alloc[pos].append((seq, replica, self._hold(seq, self.decode[pos]), math.nan, t))
            self._take_blocks(self.decode[pos])
            return seq
        # (the prefill pool runs it as a request for one token, as vLLM's proxy sends it)
        replica.enqueue(Seq(rid, t, prompt, 1, seq.prefix_hashes))
        return seq

    def _hold(self, seq: Seq, replica: Replica) -> int:
        """The tokens a decode replica holds for a transferred request before its first decode step: the
        prompt's KV and one token more (first_token: decode recomputes the last prompt token: the
        prompt's); a reservation to completion (admission 'completion') is taken whole."""
        if getattr(getattr(replica.policy, "config", None), "admission", "") == "completion":
            return seq.prompt_tokens + seq.output_tokens
        return seq.prompt_tokens + (1 if self.first_token == "prefill" else 0)

    def _refuse(self, seq: Seq, replica: Replica, reason: str) -> Seq:
        seq.status, seq.reason = REJECTED, reason
        if self.workload.closed is not None:
            self._end(seq)
        return seq

    def _prefill_ended(self, pf: Seq) -> None:
        """A prefill-side sequence ended: a rejection ends its request; a completion is handed off."""
        if pf.status != REJECTED:
            return
        seq = self.seq.pop(pf.rid)
        pos = self.paired.pop(pf.rid, None)
        if pos is not None:  # (at_arrival: the decode blocks it was given go back)
            dst = self.decode[pos]
            self.bound[pos] -= 1
            self._pools[pos].inbound -= 1
            self.in_transit.discard(pf.rid)
            self.sent_tokens.pop(pf.rid, None)
            self.first_send.pop(pf.rid, None)
            dst.release_kv(pf.rid)
            self._take_blocks(dst)
        seq.status, seq.reason, seq.replica = REJECTED, pf.reason, pf.replica
        seq.num_preemptions += pf.num_preemptions
        if self.workload.closed is not None:
            self._end(seq)

    # -- prefill done: to a decode replica ------------------------------------------------------
    def _handoff(self, pf: Seq) -> None:
        now, rid = self.env.now, pf.rid
        seq = self.seq[rid]
        seq.num_preemptions += pf.num_preemptions
        seq.cached_tokens += pf.cached_tokens  # (the prefill pool's prefix-cache hits)
        col = self.col
        col["prefill_admitted"][rid] = pf.admitted
        col["prefill_end"][rid] = now
        src = self.replicas[self._prefill_pos[pf.replica]]
        if self.pairing == "at_arrival":  # (its decode blocks are held: the transfer starts now)
            pos = self.paired.pop(rid)
            self._transfer(seq, src, pos, src.step_start, now)
            return
        pos = self.decode_route(self._pools, seq)
        pool = self._pools[pos]
        pool.inbound += 1
        self.in_transit.add(rid)
        self.alloc[pos].append((seq, src, self._hold(seq, pool.replica), src.step_start, now))
        self._take_blocks(pool.replica)

    def _take_blocks(self, replica: Replica) -> None:
        """A decode replica's plan may have freed blocks: after the livelock check, the requests waiting
        for its blocks take them by the pairing's rule, first come first served, but not while a
        preempted request (which holds no KV) waits in its queue for its own blocks: vLLM's scheduler
        reaches that one first, SGLang resumes retracted requests first."""
        waiting = replica.waiting
        if waiting and waiting[0].num_preemptions >= LIVELOCK_PREEMPTIONS:
            self.livelocked.append(replica.index)
            raise Livelock(f"decode replica {replica.index} livelocked at {self.env.now:.6g} s: request "
                           f"{waiting[0].rid} was preempted {LIVELOCK_PREEMPTIONS} times")
        pos = replica.index - self.decode[0].index
        queue = self.alloc[pos]
        if not queue or any(replica.kv.held(s.rid) == 0 for s in waiting):
            return
        (self._preallocate if self.pairing == "at_arrival" else self._admit_transfers)(replica, pos, queue)

    def _admit_transfers(self, replica: Replica, pos: int, queue: deque) -> None:
        """pairing after_prefill: the waiting transfers take their blocks as they are free and as vLLM's
        scheduler reaches them, behind every request already in the replica's queue."""
        kv, now = replica.kv, self.env.now
        while queue:
            seq, src, hold, step_start, prefill_end = queue[0]
            if kv.blocks_needed(seq, hold) > kv.free_blocks:
                return
            queue.popleft()
            kv.grow(seq.rid, hold)
            self.col["decode_blocks"][seq.rid] = now
            # (per_layer overlaps the prefill only if the blocks were free when it ended)
            self._transfer(seq, src, pos, step_start, prefill_end)

    def _preallocate(self, replica: Replica, pos: int, queue: deque) -> None:
        """pairing at_arrival: the requests paired with this decode replica take their blocks while
        ``blocks x block_size + reserved_tokens`` of each fits in what is free less ``reserved_tokens``
        for every request the replica runs, holds in its queue or has pre-allocated, and the first that
        does not fit stops the pass (SGLang's ``DecodePreallocQueue.pop_preallocated``). A request that
        has its blocks enters its prefill replica's queue."""
        kv, now, reserve = replica.kv, self.env.now, self.reserved_tokens
        allocatable = (kv.free_blocks * kv.block_size
                       - reserve * (len(replica.running) + replica.queued + self.bound[pos]))
        while queue:
            seq, src, hold, _, sent = queue[0]
            need = kv.blocks_needed(seq, hold)
            if need * kv.block_size + reserve > allocatable:
                return
            queue.popleft()
            kv.grow(seq.rid, hold)
            allocatable -= need * kv.block_size + reserve
            self.bound[pos] += 1
            self.col["decode_blocks"][seq.rid] = now
            # (bootstrapped: the prefill replica runs it as a request for one token)
            self._prefill_views[self._prefill_pos[src.index]].inbound -= 1
            src.enqueue(Seq(seq.rid, sent, seq.prompt_tokens, 1, seq.prefix_hashes))

    def _send_chunks(self, replica: Replica) -> None:
        """per_chunk: after a prefill replica's step, each of its requests still prefilling sends the whole
        blocks its chunks have computed and not yet sent (SGLang's ``send_kv_chunk`` for the chunked
        request: a last partial page waits for the next send); the rest leaves with the last chunk."""
        now, bs, src = self.env.now, replica.kv.block_size, self._prefill_pos[replica.index]
        for pf in replica.running:
            pos = self.paired.get(pf.rid)
            if pos is None:
                continue
            end = pf.num_computed - pf.num_computed % bs
            done = self.sent_tokens.get(pf.rid, 0)
            if end > done:  # (a request preempted and recomputing sends only what is new)
                start, _ = self.link.transfer(src, pos, (end - done) * self.kv_bytes_per_token, now, last=False)
                self.sent_tokens[pf.rid] = end
                self.first_send.setdefault(pf.rid, start)

    def _transfer(self, seq: Seq, src: Replica, pos: int, step_start: float, prefill_end: float) -> None:
        """The request's KV onto the link to decode replica ``pos``: it holds its blocks there (per_chunk:
        what its earlier chunks did not send)."""
        now, rid = self.env.now, seq.rid
        left = seq.prompt_tokens - self.sent_tokens.pop(rid, 0)
        overlap = (step_start, prefill_end) if now == prefill_end else None
        start, end = self.link.transfer(self._prefill_pos[src.index], pos, left * self.kv_bytes_per_token, now,
                                        overlap)
        self.col["transfer_start"][rid] = self.first_send.pop(rid, start)
        self.col["kv_transfer_bytes"][rid] = seq.prompt_tokens * self.kv_bytes_per_token
        self.flying[pos] += 1
        self.env.process(self._arrive(seq, src, self.decode[pos], end))

    def _arrive(self, seq: Seq, src: Replica, dst: Replica, end: float):
        if end > self.env.now:
            yield self.env.timeout(end - self.env.now)
        end = self.env.now  # (the clock's own sum, which every later stamp is compared with)
        rid = seq.rid
        src.release_kv(rid)  # (the decode side has read it)
        self.in_transit.discard(rid)
        self.col["transfer_end"][rid] = end
        pos = dst.index - self.decode[0].index
        self._pools[pos].inbound -= 1
        self.flying[pos] -= 1
        if self.pairing == "at_arrival":
            self.bound[pos] -= 1  # (from here it is in the replica's queue, or done)
        self.seq.pop(rid)
        p = seq.prompt_tokens
        if self.first_token == "prefill":  # (the prefill's token arrives with the KV: SGLang)
            seq.num_computed, seq.num_tokens, seq.num_generated = p, p + 1, 1
            # (and reaches its client through the decode replica's frontend, as the tokens it emits do)
            fe = dst._frontend
            if fe is not None:
                end = dst._out_free = delivered_at(end, dst._out_free, 1, fe[2], fe[3])
            seq.first_token = seq.last_token = end
            if seq.output_tokens <= 1:
                seq.finished, seq.status, seq.completion, seq.replica = True, COMPLETED, end, dst.index
                dst.release_kv(rid)  # (and wake it: a request there may be waiting for these blocks)
                if dst.on_done is not None:
                    dst.on_done(seq)
                self._take_blocks(dst)
                return
        else:  # (the decode side recomputes the last prompt token and samples the first: vLLM)
            seq.num_computed = p - 1
        dst.enqueue(seq)  # (holding its KV: the policy admits it as any waiting request)

    # -- records --------------------------------------------------------------------------------
    def held(self) -> set[int]:
        """The rids a replica or the link still holds (every unfinished request is one of them)."""
        out = set(self.in_transit)
        for r in (*self.replicas, *self.decode):
            out.update(r.seqs)
        return out

    def stalled(self) -> list[int]:
        """Decode replicas that can never move again: idle with requests running or waiting that it
        cannot schedule, and no transfer on the link to it (one waiting for its blocks cannot get
        them: nothing will free any), or livelocked (a request preempted
        :data:`LIVELOCK_PREEMPTIONS` times: a recompute that keeps preempting itself one block
        short, chunk after chunk). It happens when the KV is held by transferred
        requests queued behind a preempted one that cannot get its blocks back: a first-come-first-
        served queue (vLLM's scheduler breaks at the first request it cannot allocate) stops at its
        head, and the transferred requests' blocks are never freed."""
        # (pairing at_arrival: a paired request that cannot take its blocks from an idle replica with
        # nothing on its way to it never will: its prompt and the reserve exceed what the replica has)
        unpaired = [self.pairing == "at_arrival" and bool(q) and not b for q, b in zip(self.alloc, self.bound)]
        idle = [r.index for r, n, u in zip(self.decode, self.flying, unpaired)
                if (r.running or r.waiting or u) and not n and r._wake is not None]
        return sorted(set(idle + self.livelocked))

    def transfer_columns(self, requests) -> dict[str, np.ndarray]:
        """The :data:`TRANSFER_COLUMNS` for the request records (rows in ``requests['rid']`` order);
        ``decode_admitted`` from each record's ``admitted``, which the decode replica set."""
        rid = requests["rid"].to_numpy(dtype=np.int64)
        out = {c: self.col[c][rid] for c in TRANSFER_COLUMNS}
        out["decode_admitted"] = requests["admitted"].to_numpy(dtype=np.float64)
        return out

