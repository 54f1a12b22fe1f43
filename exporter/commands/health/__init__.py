"""`health`: ask the local exporter for its verdict and tell the scheduler, its own way.

No remediation service of ours: node-problem-detector runs the command as a custom
plugin (one line, exit 0 OK, 1 problem, 2 unknown) and turns it into a node condition;
Slurm runs it as `HealthCheckProgram` with `--slurm-drain`, and it drains the node with
`scontrol` when the node's action needs it (docs/kubernetes.md, deploy/slurm/README.md).

- verdict.py: the answer of /api/v1/health, read and checked; its line and exit code.
- client.py: where the exporter listens and how to reach it (TLS, basic auth).
- slurm.py: whether the node must drain, and the scontrol calls that drain it.
- command.py: the command line.
"""
