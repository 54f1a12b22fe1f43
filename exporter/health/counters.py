"""The counter points the rate checks need: a few (time, value) points per counter.

DCGM's health watches compare a counter's change over the last minute; the snapshot
holds only the latest read, so the monitor keeps the points of each counter it judges
(one per device read) for as long as its window asks. A counter kept for a week (retired
pages) keeps only the reads where it changed. A counter that went down (driver reload,
GPU reset) starts over.
"""

from __future__ import annotations

from collections import deque


class CounterPoints:
    def __init__(self) -> None:
        self._points: dict[tuple, deque[tuple[float, float]]] = {}
        self._latest: dict[tuple, float] = {}  # time of the newest read of each counter

    def observe(self, key: tuple, time: float, value: float, keep: float,
                changes_only: bool = False) -> None:
        points = self._points.get(key)
        if points is None:
            points = self._points[key] = deque()
        elif time <= self._latest.get(key, time):
            return  # this read was seen already
        if points and value < points[-1][1]:
            points.clear()  # reset: the old points say nothing about the new count
        if not (changes_only and points and value == points[-1][1]):
            points.append((time, value))
        self._latest[key] = time
        while len(points) > 1 and points[1][0] <= time - keep:
            points.popleft()  # the point before the window stays: it starts the window

    def increase(self, key: tuple, window: float) -> tuple[float, float] | None:
        """(increase, seconds it covers) over the last `window` seconds: from the newest
        point at or before the window's start (or the oldest kept) to the latest read;
        None before a second read."""
        points = self._points.get(key)
        if not points:
            return None
        end_time, end = self._latest[key], points[-1][1]
        start_time, start = points[0]
        for t, v in reversed(points):
            if t <= end_time - window:
                start_time, start = t, v
                break
        if end_time <= start_time:
            return None
        return end - start, end_time - start_time
