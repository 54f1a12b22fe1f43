"""`health --slurm-drain`: drain the node through Slurm when its action needs it.

    scontrol update NodeName=<node> State=DRAIN "Reason=<prefix>: <reasons>"

when the node's action is `reboot_node` or `drain_and_service`, or `reset_gpu` while a
job runs on the node (a reset kills what runs on the GPU: draining lets the jobs finish
and keeps new ones off until someone resets it; with no job there the GPU can be reset at
once). Whether jobs run is Slurm's own view: `scontrol show node <node> --oneliner`,
state ALLOCATED, MIXED or COMPLETING; when Slurm cannot say, the node is drained.

It never resumes a node. A node someone else drained (a reason without our prefix) is
left as it is, its reason kept; one we drained is updated only when the reason changed.
It fits slurm.conf's HealthCheckProgram: each scontrol call is bounded (SCONTROL_TIMEOUT,
two calls at most, well inside the 60 s after which slurmd kills the program).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.commands.health.verdict import Verdict, cut
from exporter.health.model import DRAIN_AND_SERVICE, REBOOT_NODE, RESET_GPU

SCONTROL_TIMEOUT = 20.0  # seconds per call
DEFAULT_PREFIX = "cte"
MAX_REASON = 240  # sinfo -R shows the start; keep the whole reason readable
_JOB_STATES = {"ALLOCATED", "MIXED", "COMPLETING"}
_DRAIN_STATES = {"DRAIN", "DRAINED", "DRAINING"}


def default_node_name() -> str:
    """slurmd's name for this node where it says it, else the short host name (Slurm's
    own default NodeName)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


@dataclass(frozen=True)
class NodeState:
    """What `scontrol show node` says: its state words and the drain reason."""

    states: frozenset[str]
    reason: str

    @property
    def jobs_run(self) -> bool:
        return bool(self.states & _JOB_STATES)

    @property
    def drained(self) -> bool:
        return bool(self.states & _DRAIN_STATES)


def parse_node(text: str) -> NodeState | None:
    """`State=MIXED+DRAIN ... Reason=text [user@time]` -> NodeState; None if no State."""
    state = re.search(r"(?:^|\s)State=(\S+)", text)
    if state is None:
        return None
    words = frozenset(w.strip("*~#!%$@^-").upper() for w in state.group(1).split("+"))
    # the reason runs to Slurm's " [user@time]" after it (or to the end of the line)
    reason = re.search(r"(?:^|\s)Reason=(.*?)(?:\s+\[[^\]\s]*@[^\]]*\]|\s*$)", text, re.M)
    text_reason = reason.group(1).strip() if reason else ""
    return NodeState(words, "" if text_reason in ("(null)", "None") else text_reason)


@dataclass(frozen=True)
class Outcome:
    """What --slurm-drain did: `drained` true when scontrol drained (or re-reasoned) the
    node, `failed` when a drain was needed and scontrol refused or could not run."""

    detail: str
    drained: bool = False
    failed: bool = False
    command: tuple[str, ...] = ()


class Scontrol:
    """Runs scontrol (bounded in time); the one place the command touches Slurm."""

    def __init__(self, program: str = "scontrol", timeout: float = SCONTROL_TIMEOUT):
        self.program = program
        self.timeout = timeout

    def run(self, args: Sequence[str]) -> tuple[int, str]:
        """(exit status, output or the reason it could not run); status -1: not run."""
        try:
            done = subprocess.run([self.program, *args], capture_output=True, text=True,
                                  timeout=self.timeout, check=False, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return -1, f"{self.program} not found (is Slurm installed, PATH set?)"
        except subprocess.TimeoutExpired:
            return -1, f"{self.program} gave no answer within {self.timeout:g} s"
        except OSError as exc:
            return -1, f"cannot run {self.program}: {exc.strerror or exc}"
        return done.returncode, (done.stdout + done.stderr).strip()


def needs_drain(verdict: Verdict) -> bool | None:
    """True: drain; False: nothing to do in Slurm; None: drain if jobs run."""
    if verdict.action in (REBOOT_NODE, DRAIN_AND_SERVICE):
        return True
    return None if verdict.action == RESET_GPU else False


def reason_text(prefix: str, verdict: Verdict) -> str:
    return cut(f"{prefix}: {verdict.action}: {verdict.reasons or verdict.state}", MAX_REASON)


def drain(verdict: Verdict, node: str, scontrol: Scontrol,
          prefix: str = DEFAULT_PREFIX) -> Outcome:
    """Drain `node` if its verdict needs it (see the module's docstring)."""
    need = needs_drain(verdict)
    if need is False:
        return Outcome(f"slurm: nothing to drain (action {verdict.action})")
    status, shown = scontrol.run(["show", "node", node, "--oneliner"])
    state = parse_node(shown) if status == 0 else None
    if need is None and state is not None and not state.jobs_run:
        return Outcome(f"slurm: {node} runs no job: not drained; reset the GPU now")
    reason = reason_text(prefix, verdict)
    if state is not None and state.drained:
        if not state.reason.startswith(f"{prefix}:"):
            return Outcome(f"slurm: {node} is already drained by someone else "
                           f"({state.reason or 'no reason'}): left as it is")
        if state.reason == reason:
            return Outcome(f"slurm: {node} is already drained for this reason")
    command = ("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
    status, output = scontrol.run(command)
    argv = (scontrol.program, *command)
    if status != 0:
        return Outcome(f"slurm: could not drain {node}: {cut(output, 200) or f'exit {status}'}",
                       failed=True, command=argv)
    why = "" if state is not None else " (Slurm did not say whether jobs run)"
    return Outcome(f"slurm: drained {node}{why}", drained=True, command=argv)
