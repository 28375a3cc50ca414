"""The application: scenario config, the runner (config -> parts -> run -> records), the CLI and
the jobs users run (compare, sweep, capacity planning, regress, validate)."""
