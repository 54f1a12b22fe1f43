"""Episodes: bursts of one kind of fault on one GPU (or the node), merged the way
NVIDIA NVSentinel's health-events analyzer merges them.

A gap of more than 180 s starts a new episode; the sticky XIDs (74, 79, 95, 109, 119),
which the driver repeats while a GPU stays broken, stay in one episode while each comes
within 3 h (10,800 s) of the last (NVSentinel `health-events-analyzer/values.yaml`,
RepeatedXIDErrorOnSameGPU). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

GAP_SECONDS = 180.0
STICKY_GAP_SECONDS = 10_800.0
STICKY_XIDS = frozenset({74, 79, 95, 109, 119})

# (serial, uuid) of a GPU; ("", "") is the node itself (a NIC port, the fabric)
GpuKey = tuple[str, str]
NODE: GpuKey = ("", "")


@dataclass
class Episode:
    gpu: GpuKey
    kind: str  # one of exporter.events.KINDS
    xid: int | None  # the XID's code where kind is "xid"
    detail: str  # what tells episodes of one kind apart on one GPU: a port, a link
    start: float  # unix seconds
    end: float  # the last occurrence
    count: int = 1
    id: int | None = None  # the store's row, once written

    @property
    def key(self) -> tuple[GpuKey, str, int | None, str]:
        return self.gpu, self.kind, self.xid, self.detail


def merge_gap(kind: str, xid: int | None) -> float:
    """How long after an episode's last occurrence a new one still belongs to it."""
    return STICKY_GAP_SECONDS if kind == "xid" and xid in STICKY_XIDS else GAP_SECONDS


class Merger:
    """Keeps the open episode of each (GPU, kind, xid, detail) and says whether a new
    occurrence extends it or starts another."""

    def __init__(self) -> None:
        self.open: dict[tuple[GpuKey, str, int | None, str], Episode] = {}

    def add(self, gpu: GpuKey, kind: str, time: float, xid: int | None = None,
            detail: str = "", count: int = 1) -> tuple[Episode, bool]:
        """The episode these `count` occurrences at `time` belong to, and True when it is
        a new one."""
        key = (gpu, kind, xid, detail)
        last = self.open.get(key)
        if last is not None and last.start - GAP_SECONDS <= time <= last.end + merge_gap(kind, xid):
            last.end = max(last.end, time)
            last.count += count
            return last, False
        episode = Episode(gpu, kind, xid, detail, time, time, count)
        if last is None or time >= last.end:
            self.open[key] = episode
        return episode, True

    def resume(self, episode: Episode) -> None:
        """An episode read back from the store, still open to merging."""
        last = self.open.get(episode.key)
        if last is None or episode.end > last.end:
            self.open[episode.key] = episode

    def close_before(self, time: float) -> None:
        """Forget episodes that nothing can extend any more."""
        for key, episode in list(self.open.items()):
            if time - episode.end > merge_gap(episode.kind, episode.xid):
                del self.open[key]
