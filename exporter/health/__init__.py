"""Per-GPU health checks and verdicts, from what the sampler already read.

Entry point: `HealthMonitor(settings).assess(snapshot) -> NodeHealth` (monitor.py). The
checks are small pure functions of a GPU's inputs (checks_*.py), each with its
threshold in `HealthSettings` (settings.py) and its source named; the values they return
and the verdicts are in model.py. docs/health.md lists them.
"""
