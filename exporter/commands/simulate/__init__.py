"""`simulate`: a fleet of virtual nodes in one process, each a whole exporter on its own port.

- scenario.py: the fleet scenario (jobs, faults), parsed from YAML with file:line errors.
- fabric.py: one node's generated InfiniBand sysfs tree, advanced to the fleet's time.
- runner.py: `Fleet`, which starts, runs and stops the nodes and their fabrics.
- command.py: the command line.
"""
