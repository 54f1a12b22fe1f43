"""What a health check says and what a verdict is: plain frozen values, no NVML.

A check's state is one of five; a GPU's verdict is the worst of its checks' states, one
action (the strongest any non-ok check asks for) and its reasons in one line. The node's
verdict is the worst GPU's and its own checks'. Order matters twice: states from
`not_applicable` (nothing to judge) to `failed`, actions from `none` to
`drain_and_service` (what it takes to get the GPU back: the last needs a person).
"""

from __future__ import annotations

from dataclasses import dataclass

OK, WARNING, FAILED, UNKNOWN, NOT_APPLICABLE = (
    "ok", "warning", "failed", "unknown", "not_applicable")
# least to most severe: an unknown check outranks ok (we cannot say the GPU is fine)
STATES = (NOT_APPLICABLE, OK, UNKNOWN, WARNING, FAILED)
NONE, RESTART_APPLICATION, RESET_GPU, REBOOT_NODE, DRAIN_AND_SERVICE = (
    "none", "restart_application", "reset_gpu", "reboot_node", "drain_and_service")
ACTIONS = (NONE, RESTART_APPLICATION, RESET_GPU, REBOOT_NODE, DRAIN_AND_SERVICE)
# The action in the words of every sentence, page and answer that a person reads (the
# token above is the API's and the metrics' value; NVML's own recovery tokens, gpu_reset
# and the like, stay on gpu_recovery_action only, as the driver's).
ACTION_WORDS = {NONE: "do nothing", RESTART_APPLICATION: "restart the application",
                RESET_GPU: "reset the GPU", REBOOT_NODE: "reboot the node",
                DRAIN_AND_SERVICE: "drain the node and service the GPU"}
_STATE_RANK = {state: rank for rank, state in enumerate(STATES)}
_ACTION_RANK = {action: rank for rank, action in enumerate(ACTIONS)}

Value = float | str | None


@dataclass(frozen=True)
class Outcome:
    """What one check function concludes: the state, the value it saw, the threshold it
    compared with, and for a state other than ok the action and a short reason (stable
    text without the value, so it can be a label that changes only with the verdict)."""

    state: str
    value: Value = None
    threshold: Value = None
    action: str = NONE
    reason: str = ""


@dataclass(frozen=True)
class CheckResult:
    """One check of one GPU (or of the node), as served: name, state, the value seen,
    the threshold and where it comes from, and since when the check has been in its
    state (epoch seconds)."""

    name: str
    state: str
    value: Value
    threshold: Value
    source: str
    since: float
    action: str = NONE
    reason: str = ""
    port: str = ""  # "device/port" for a check judged per InfiniBand port


@dataclass(frozen=True)
class Verdict:
    """A GPU's or the node's: the worst state of its checks, one action, and the reasons
    of the checks that are not ok, in one line."""

    state: str
    action: str
    reasons: str
    checks: tuple[CheckResult, ...]


@dataclass(frozen=True)
class NodeHealth:
    """Every verdict of one snapshot: the node's and each GPU's, by index."""

    time: float
    node: Verdict
    gpus: dict[int, Verdict]
    check_errors: tuple[tuple[str, int], ...] = ()  # (check, times it raised), cumulative

    def failed_gpus(self) -> frozenset[int]:
        """The GPUs this verdict judges failed (the goodput account's `failed`)."""
        return frozenset(gpu for gpu, v in self.gpus.items() if v.state == FAILED)


NOT_JUDGED = "not judged yet"


def unknown_health(time: float, gpus: int, reason: str = NOT_JUDGED,
                   check_errors: tuple[tuple[str, int], ...] = ()) -> NodeHealth:
    """An explicit `unknown` verdict for the node and each of its GPUs, with no checks:
    what is served before the first judgement, or when judging itself failed. Never a
    pass: every reader says unknown (dcgm-exporter's health status is not served)."""
    unknown = Verdict(UNKNOWN, NONE, reason, ())
    return NodeHealth(time, unknown, {gpu: unknown for gpu in range(gpus)}, check_errors)


def worse(a: str, b: str) -> str:
    return a if _STATE_RANK[a] >= _STATE_RANK[b] else b


def stronger(a: str, b: str) -> str:
    return a if _ACTION_RANK[a] >= _ACTION_RANK[b] else b


def action_words(action: str) -> str:
    return ACTION_WORDS.get(action, action.replace("_", " "))


def state_rank(state: str) -> int:
    return _STATE_RANK[state]


def action_rank(action: str) -> int:
    return _ACTION_RANK[action]


def _relevant(state: str) -> tuple[str, ...]:
    """The states whose reasons a verdict in `state` gives: problems, or, while nothing
    is wrong but something cannot be judged, what cannot."""
    return (FAILED, WARNING) if state in (FAILED, WARNING) else (UNKNOWN,)


def verdict(checks: tuple[CheckResult, ...], prefix: str = "") -> Verdict:
    """The worst state, the strongest action of the checks that need one, and their
    reasons worst first, each once (`prefix` names whose they are: "GPU 3: ")."""
    state, action = (NOT_APPLICABLE if checks else UNKNOWN), NONE
    for check in checks:
        state = worse(state, check.state)
        if check.state in (WARNING, FAILED):
            action = stronger(action, check.action)
    relevant = _relevant(state)
    bad = sorted((c for c in checks if c.state in relevant and c.reason),
                 key=lambda c: -_STATE_RANK[c.state])
    reasons = list(dict.fromkeys(c.reason for c in bad))
    return Verdict(state, action, prefix + ", ".join(reasons) if reasons else "", checks)


def combine(own: Verdict, parts: list[Verdict]) -> Verdict:
    """The node's verdict: its own checks' and the GPUs' (whose reasons already name
    their GPU), worst state and strongest action."""
    state, action = own.state, own.action
    for part in parts:
        state = worse(state, part.state)
        action = stronger(action, part.action)
    relevant = _relevant(state)
    worst_first = sorted([own, *parts], key=lambda v: -_STATE_RANK[v.state])
    reasons = "; ".join(v.reasons for v in worst_first if v.reasons and v.state in relevant)
    return Verdict(state, action, reasons, own.checks)
