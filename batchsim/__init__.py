"""batchsim: simulate how an LLM inference server batches requests, priced by a roofline cost model.

Layers, bottom up: ``batchsim.sim`` (kernel types and the SimPy engine: requests, plans, KV cache,
routers, records, metrics), ``batchsim.policies`` (batching policies and their recipes),
``batchsim.workloads`` (arrivals, lengths, traces), ``batchsim.calibrate`` (the cost model,
hardware profiles, calibration and the reference executor), ``batchsim.reports`` (tables, plots,
HTML from records), ``batchsim.core`` (the compiled core: the same rules in C) and
``batchsim.app`` (configuration, the runner, the CLI and the jobs: compare, sweep, capacity
planning, regress, validate).
"""

__version__ = "0.1.0"
