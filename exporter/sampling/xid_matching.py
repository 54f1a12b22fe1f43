"""One XID that NVML's events and the kernel log both report counts once: the
occurrences of each source not matched yet, by GPU (its index, or the PCI slot of
a GPU no longer on the bus) and code, matched against the other's.

Each entry (a report of several at once is one, with its count) is matched, and dropped,
once, so matching costs time linear in what the sources report, however long the log.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

# An NVML event and a log line of one XID on one GPU this close are one XID. Reasoned, not
# measured: the event's time is when the watcher took it (within its 2-s wait, plus a busy
# thread), the line's is the boot time estimated from the wall clock now plus the record's
# stamp (off by any clock step or slew since: NTP slews at most 0.5 ms/s), and a burst
# NVML's events bring at once carries the time it was taken while the log has each
# line's. Wider, and two XIDs of one code on one GPU, one only NVML saw and one only the
# log, would count once.
MATCH_SECONDS = 30.0
MAX_UNMATCHED = 10_000  # entries kept for one GPU, code and source (the oldest go)
_OTHER_SOURCE = {"nvml": "kmsg", "kmsg": "nvml"}


@dataclass
class Seen:
    time: float
    count: int  # occurrences not matched yet


class XidMatcher:
    def __init__(self) -> None:
        # (GPU, code, source: "nvml" or "kmsg") -> its entries not matched yet, oldest first
        self.unmatched: dict[tuple[Hashable, int, str], deque[Seen]] = {}
        self.duplicates = 0  # occurrences both sources reported, counted once

    def new(self, gpu: Hashable, code: int, at: float, source: str, count: int) -> int:
        """Of `count` occurrences at `at` from `source`, those the other source did not
        report within MATCH_SECONDS (kept, for the other source to match)."""
        return self.match(gpu, code, at, source, count)[0]

    def match(self, gpu: Hashable, code: int, at: float, source: str,
              count: int) -> tuple[int, list[float]]:
        """As `new`, and the times of the other source's reports these matched (each
        once)."""
        remaining = count
        matched: list[float] = []
        other = self.unmatched.get((gpu, code, _OTHER_SOURCE[source]))
        if other:
            for seen in other:
                if seen.count and abs((when := seen.time) - at) <= MATCH_SECONDS:
                    taken = min(remaining, seen.count)
                    seen.count -= taken
                    remaining -= taken
                    self.duplicates += taken
                    matched.append(when)
                    if remaining == 0:
                        break
            _forget(other, at)
        if remaining:
            own = self.unmatched.setdefault((gpu, code, source), deque(maxlen=MAX_UNMATCHED))
            _forget(own, at)
            own.append(Seen(at, remaining))
        return remaining, matched


def _forget(entries: deque[Seen], at: float) -> None:
    """Drop the entries matched whole, and those too old to match occurrences from `at`."""
    while entries and (entries[0].count == 0 or at - entries[0].time > 2 * MATCH_SECONDS):
        entries.popleft()
