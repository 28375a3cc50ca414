"""The simulation kernel: value types, protocols, request state, the paged KV cache, routers,
the SimPy engine, and the records and metrics a run produces."""
