"""A GPU's undecided stretch in the goodput account (analysis.goodput): the seconds after
its job's steps that are not work, by how they looked, until the stretch is decided; and
its edges that looked like the steps' communication phase (docs/goodput.md, "A pause's
edges"). Pure numpy."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from exporter.analysis.checkpoints import CULPRIT, ELSEWHERE, TOGETHER, WRITER

# how a pending second of a GPU looked: its job paused in one of analysis.checkpoints'
# looks, or the GPU low alone while its job works
ALONE = "alone"
LOOKS = (TOGETHER, WRITER, ELSEWHERE, CULPRIT, ALONE)
AT = {look: i for i, look in enumerate(LOOKS)}
WAITS = [AT[WRITER], AT[ELSEWHERE], AT[CULPRIT]]  # waiting in a collective


@dataclass
class Stretch:
    """A GPU's undecided stretch after steps: seconds and joules by how they looked, and
    its seconds in each of its job's pauses (by serial number)."""

    seconds_by: np.ndarray = field(default_factory=lambda: np.zeros(len(LOOKS)))
    joules_by: np.ndarray = field(default_factory=lambda: np.zeros(len(LOOKS)))
    in_pause: dict[int, float] = field(default_factory=dict)
    # seconds (and joules) by look that looked like the steps' communication phase, before
    # the stretch's first second that did not (lead) and since its last one (trail)
    lead_s: np.ndarray = field(default_factory=lambda: np.zeros(len(LOOKS)))
    lead_j: np.ndarray = field(default_factory=lambda: np.zeros(len(LOOKS)))
    trail_s: np.ndarray = field(default_factory=lambda: np.zeros(len(LOOKS)))
    trail_j: np.ndarray = field(default_factory=lambda: np.zeros(len(LOOKS)))
    anchored: bool = False  # a second that did not look like the communication phase

    def add(self, at: int, dt: float, joules: float, comm: bool) -> None:
        self.seconds_by[at] += dt
        self.joules_by[at] += joules
        if not comm:
            self.anchored = True
            self.trail_s[:], self.trail_j[:] = 0.0, 0.0
        elif self.anchored:
            self.trail_s[at] += dt
            self.trail_j[at] += joules
        else:
            self.lead_s[at] += dt
            self.lead_j[at] += joules

    def trim(self, trail: bool) -> tuple[float, float]:
        """Take out the edges that looked like the steps' communication phase (the lead,
        and the trail where the steps resumed): (seconds, joules) taken. Nothing where
        every second looked so: then nothing marks where the pause began."""
        if not self.anchored:
            return 0.0, 0.0
        s, j = self.lead_s + (self.trail_s if trail else 0.0), self.lead_j + (
            self.trail_j if trail else 0.0)
        self.seconds_by = self.seconds_by - s
        self.joules_by = self.joules_by - j
        return float(s.sum()), float(j.sum())

    @property
    def seconds(self) -> float:
        return float(self.seconds_by.sum())
