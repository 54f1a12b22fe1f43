"""Which global rank works on each GPU, from a processes reading: pure, for the accounts
that speak of a job's ranks rather than the node's GPUs (the goodput account)."""

from __future__ import annotations

from exporter.collectors.processes.reading import ProcessesReading

__all__ = ["gpu_ranks"]


def gpu_ranks(reading: ProcessesReading) -> dict[int, int]:
    """GPU index -> the global rank of the process that holds it.

    Processes without a known rank (not a distributed job's, their environment refused,
    ``--no-collector.processes.proc-labels``) are left aside. A GPU is in the map only
    when the ranked processes on it all carry one rank: two ranks on one GPU (processes
    of two jobs, or a job restarted with another layout, whose exited process is still in
    the reading for one read) say nothing about which rank the GPU's time belongs to.
    """
    seen: dict[int, set[int]] = {}
    for process in reading.processes:
        rank = process.labels.rank if process.labels is not None else None
        if rank is not None:
            seen.setdefault(process.gpu, set()).add(rank)
    return {gpu: next(iter(ranks)) for gpu, ranks in sorted(seen.items()) if len(ranks) == 1}
