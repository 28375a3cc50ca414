"""batchsim's simulator core: types, engine, KV cache, records, config, CLI."""

__version__ = "0.1.0"
