"""The serving frontend: the process between a client and the engine's scheduler.

Every engine batchsim models puts one frontend process in front of its scheduler
(docs/engine-presets-research.md, Topic D): vLLM's API server (``AsyncLLM``: tokenize in,
detokenize and stream out, ZMQ to ``EngineCore``), SGLang's ``TokenizerManager`` and
``DetokenizerManager``, TensorRT-LLM's ``LLM`` front end. batchsim models it as two
first-come-first-served servers per replica, with the hardware profile's
:class:`~batchsim.calibrate.hardware.FrontendOverhead` terms:

- **in**: a request sent at ``t`` reaches the engine's queue when a frontend process has received
  and tokenized it, the replicas' processes taking requests first come first served
  (:class:`InServers`, :func:`tokenized_at`);
- **out**: the tokens a step emits reach their clients when the frontend has detokenized
  and streamed them and every earlier step's: :func:`delivered_at`. A request's first token,
  its inter-token gaps and its completion are what the client sees.

With every term zero (all datasheet profiles) neither server delays anything and the engine's
times are the client's. The compiled core states :func:`delivered_at` in C
(``advance_and_record``); the in server runs before either engine (:func:`engine_arrivals`).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

__all__ = ["tokenized_at", "delivered_at", "engine_arrivals", "InServers"]


def tokenized_at(sent: float, prompt_tokens: int, free: float, per_request_s: float, per_token_s: float) -> float:
    """When a request sent at ``sent`` reaches the engine, the frontend being busy until ``free``."""
    start = sent if sent > free else free
    return start + per_request_s + per_token_s * prompt_tokens


def delivered_at(now: float, free: float, tokens: int, per_step_s: float, per_token_s: float) -> float:
    """When the ``tokens`` a step emitted at ``now`` reach their clients, the frontend being busy until ``free``."""
    start = now if now > free else free
    return start + per_step_s + per_token_s * tokens


class InServers:
    """The in side's frontend processes, one per replica, as a pool: a request goes to the one
    free soonest (a heap of when each is free), first come first served."""

    __slots__ = ("free",)

    def __init__(self, servers: int) -> None:
        self.free = [-math.inf] * max(1, servers)

    def take(self, sent: float, prompt_tokens: int, per_request_s: float, per_token_s: float) -> float:
        """When a request sent at ``sent`` reaches the engine (:func:`tokenized_at` on the first free)."""
        done = tokenized_at(sent, prompt_tokens, self.free[0], per_request_s, per_token_s)
        heapq.heapreplace(self.free, done)
        return done


def engine_arrivals(sent: np.ndarray, prompt_tokens: np.ndarray, per_request_s: float,
                    per_token_s: float, servers: int = 1) -> np.ndarray:
    """An open loop's arrival times at the engine (``sent`` in order), through ``servers`` frontend
    processes (:class:`InServers`)."""
    out = np.empty(len(sent), dtype=np.float64)
    pool = InServers(servers)
    last = -math.inf
    for i, (t, p) in enumerate(zip(sent.tolist(), prompt_tokens.tolist())):
        done = pool.take(t, p, per_request_s, per_token_s)
        # NOTE: with several processes a short prompt can finish before a long one sent earlier; the
        # engine's queue takes them in the order the frontend hands them over, which the workload's
        # sorted arrivals cannot say by rid: kept in send order, at the later of the two times.
        last = done if done > last else last
        out[i] = last
    return out
