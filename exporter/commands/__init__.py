"""The commands other than `run` (which is exporter/app.py and exporter/service.py), one
module or small package each; exporter/cli.py builds the parser from their
`add_arguments` and calls their `main`.

- health/: ask the local exporter for its verdict, for node-problem-detector and Slurm
  (exporter/entry.py runs it without importing cli.py: it must start fast).
- record.py: record GPU samples to a trace file.
- analyze.py: analyse a recorded trace (the analyses are exporter/offline/'s).
- lemons.py: rank nodes and GPUs by how likely they fail again.
- history.py: print the episodes stored in a state directory.
- simulate/: a fleet of virtual nodes in one process.

This file imports nothing: `health` must not pay for the other commands.
"""
