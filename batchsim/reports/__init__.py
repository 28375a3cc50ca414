"""Reports from records: tables, plots and a self-contained HTML page.

Reads only records (the request/step/ITL frames of ``batchsim.sim.records`` and
summary dicts); never imports SimPy, the policies or the cost model. The
orchestration that produces the records lives in ``batchsim.app.compare`` and
``batchsim.app.sweep``; see docs/reports.md.
"""
