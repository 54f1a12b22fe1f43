"""The answer of /api/v1/health, read and checked, and what the command makes of it.

Exit codes follow node-problem-detector's custom-plugin convention
(`pkg/custompluginmonitor`): 0 OK, 1 a problem, 2 unknown. A problem is a node whose
state is `failed` or whose action needs more than the application can do on its own
(a GPU reset, a reboot, a service); a `warning` is one only with `--fail-on warning`.
An exporter that cannot be reached, is not ready, or answers something that is not a
verdict is unknown: never a problem, so a stopped exporter never drains a node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exporter.health.model import (
    ACTIONS,
    DRAIN_AND_SERVICE,
    FAILED,
    NONE,
    OK,
    REBOOT_NODE,
    RESET_GPU,
    STATES,
    UNKNOWN,
    WARNING,
)
from exporter.jsontext import loads

EXIT_OK, EXIT_PROBLEM, EXIT_UNKNOWN = 0, 1, 2
# actions the node's operator (or scheduler) must take; the others the job can
NODE_ACTIONS = (RESET_GPU, REBOOT_NODE, DRAIN_AND_SERVICE)
FAIL_ON = (FAILED, WARNING)
MAX_LINE = 400  # node-problem-detector cuts stdout at max_output_length (ours: 512)


class NotAVerdict(ValueError):
    """The exporter's answer is not the documented JSON; the message says how."""


@dataclass(frozen=True)
class Verdict:
    """The node's verdict and each GPU's (state, action) by index, as served."""

    state: str
    action: str
    reasons: str
    gpus: dict[str, tuple[str, str]] = field(default_factory=dict)
    answer: dict[str, Any] = field(default_factory=dict)  # the JSON, for --format json

    def is_problem(self, fail_on: str = FAILED) -> bool:
        if self.state == FAILED or self.action in NODE_ACTIONS:
            return True
        return fail_on == WARNING and self.state == WARNING

    def exit_code(self, fail_on: str = FAILED) -> int:
        if self.is_problem(fail_on):
            return EXIT_PROBLEM
        return EXIT_UNKNOWN if self.state == UNKNOWN else EXIT_OK

    def line(self) -> str:
        """One line: `STATE: ACTION: REASONS` (node-problem-detector shows it as the
        condition's message), or for a healthy node how many GPUs were judged."""
        if self.state in (OK, "not_applicable") and self.action == NONE and not self.reasons:
            counts: dict[str, int] = {}
            for state, _ in self.gpus.values():
                counts[state] = counts.get(state, 0) + 1
            detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no GPUs"
            return cut(f"{self.state}: {len(self.gpus)} GPUs judged ({detail})")
        return cut(f"{self.state}: {self.action}: {self.reasons or 'no reason given'}")


def cut(text: str, limit: int = MAX_LINE) -> str:
    """One line of at most `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _verdict_of(value: Any, where: str) -> tuple[str, str, str]:
    if not isinstance(value, dict):
        raise NotAVerdict(f"{where} is not an object")
    state, action, reasons = value.get("state"), value.get("action"), value.get("reasons", "")
    if state not in STATES:
        raise NotAVerdict(f"{where}.state is {str(state)[:40]!r}, not one of "
                          f"{', '.join(STATES)}")
    if action not in ACTIONS:
        raise NotAVerdict(f"{where}.action is {str(action)[:40]!r}, not one of "
                          f"{', '.join(ACTIONS)}")
    if isinstance(reasons, list):  # tolerated: reasons as a list of lines
        reasons = "; ".join(str(r) for r in reasons)
    if not isinstance(reasons, str):
        raise NotAVerdict(f"{where}.reasons is not text")
    if not isinstance(value.get("checks", []), list):
        raise NotAVerdict(f"{where}.checks is not a list")
    return state, action, reasons


def parse(body: bytes) -> Verdict:
    """The verdict in /api/v1/health's answer; NotAVerdict for anything else."""
    try:
        answer = loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise NotAVerdict(f"not JSON ({exc})") from None
    if not isinstance(answer, dict):
        raise NotAVerdict("not a JSON object")
    state, action, reasons = _verdict_of(answer.get("node"), "node")
    gpus_value = answer.get("gpus", {})
    if not isinstance(gpus_value, dict):
        raise NotAVerdict("gpus is not an object keyed by GPU index")
    gpus = {}
    for index, value in gpus_value.items():
        if not str(index).isdigit():
            raise NotAVerdict(f"gpus has the key {str(index)[:20]!r}, not a GPU index")
        gpu_state, gpu_action, _ = _verdict_of(value, f"gpus.{index}")
        gpus[str(index)] = (gpu_state, gpu_action)
    return Verdict(state, action, reasons, gpus, answer)
