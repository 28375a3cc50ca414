"""Workloads: when requests arrive and how long they are.

Synthetic workloads combine an arrival process (:mod:`batchsim.workloads.arrivals`)
with prompt and output length distributions (:mod:`batchsim.workloads.lengths`);
trace replays read Azure, Mooncake, BurstGPT, ``vllm bench serve`` results,
generic CSV/JSONL and length-only files (:mod:`batchsim.workloads.traces`). Either way
the result is one columnar :class:`batchsim.sim.types.Workload`, built by
:func:`build_workload` from a validated :class:`WorkloadConfig`.
"""

from .build import build_workload
from .config import WorkloadConfig
from .traces import TraceNote, trace_notes

__all__ = ["WorkloadConfig", "build_workload", "TraceNote", "trace_notes"]
