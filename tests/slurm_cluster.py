"""A one-node Slurm cluster in a temporary directory, for tests/test_slurm_real.py.

Debian's slurmctld and slurmd (22.05 on bookworm) with a munged of its own: its own key
and socket, its own ports on loopback, state, spool, logs and slurm.conf, all under one
directory (SLURM_CONF points the client commands at it). gres.conf lists eight GPU
device files made with mknod in the same directory (character devices 195:N, as
/dev/nvidiaN; nothing opens them). Nothing system-wide is read or written: no
/etc/slurm, /etc/munge, /run/munge or /var/spool/slurm*. Every daemon runs in the
foreground as a child of the test and is stopped by its PID; processes slurmd started
(slurmstepd, job scripts) are found by the SLURM_CONF in their environment, which names
this directory, and stopped by PID too.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.tools import free_base_port, stop_process

NODE = "ctenode"
PARTITION = "gpu"
GPUS = 8
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "squeue",
           "sinfo")


class SlurmCluster:
    """Start with `start()`; `stop()` always (it stops whatever did start)."""

    def __init__(self, tools: dict[str, str], health_check_interval: int = 2) -> None:
        self.tools = tools
        # munged insists that every directory above its socket is searchable by all, and
        # a socket's path has at most 107 bytes: a short directory under /tmp, not pytest's
        self.root = Path(tempfile.mkdtemp(prefix="cte-slurm-", dir="/tmp"))
        self.root.chmod(0o755)
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "socket"
        # as deploy/slurm/README.md installs them: every script in a directory
        self.prolog, self.epilog = self.root / "prolog.d", self.root / "epilog.d"
        self.health_check = self.root / "health-check"
        self.health_check_interval = health_check_interval
        self.procs: list[subprocess.Popen] = []

    @property
    def env(self) -> dict[str, str]:
        """The environment for the client commands: this cluster's slurm.conf."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- start and stop ---------------------------------------------------------------------

    def start(self, **slurmd_env: str) -> None:
        """Start munged, slurmctld and slurmd (`slurmd_env` added to its environment);
        the prolog, epilog and health check are the test's to write first."""
        self._write_files()
        self._daemon([self.tools["munged"], "--foreground",
                      f"--key-file={self.root / 'munge' / 'munge.key'}",
                      f"--socket={self.munge_socket}",
                      f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                      f"--log-file={self.root / 'log' / 'munged.log'}",
                      f"--seed-file={self.root / 'munge' / 'munged.seed'}"], "munged")
        self._wait(self.munge_socket.exists, 10, "munged made no socket")
        self._daemon([self.tools["slurmctld"], "-D", "-f", str(self.conf)], "slurmctld")
        self._daemon([self.tools["slurmd"], "-D", "-f", str(self.conf), "-N", NODE], "slurmd",
                     slurmd_env)
        self._wait(lambda: self.node_state() is not None and "IDLE" in self.node_state(), 30,
                   "the node did not come up idle")

    def _daemon(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> None:
        out = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - the child's
        try:
            self.procs.append(subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**self.env, **(env or {})}, cwd=self.root))
        finally:
            out.close()

    def stop(self) -> None:
        """Cancel the jobs, stop the daemons and anything slurmd started, by PID; remove
        the directory."""
        try:
            if self.procs and self.procs[-1].poll() is None:
                jobs = self.run("squeue", "-h", "-o", "%i", check=False).split()
                if jobs:
                    self.run("scancel", *jobs, check=False)
                    self._wait(lambda: not self.run("squeue", "-h", check=False).strip(), 10,
                               None)
        finally:
            for proc in reversed(self.procs):
                stop_process(proc)
            self._kill_leftovers()
            shutil.rmtree(self.root, ignore_errors=True)

    def _kill_leftovers(self) -> None:
        """slurmstepd and job scripts outlive a stopped slurmd: they carry SLURM_CONF=ours."""
        mark = f"SLURM_CONF={self.conf}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if mark in environ:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)

    @staticmethod
    def _wait(predicate, timeout: float, failure: str | None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        if failure is not None:
            raise RuntimeError(failure)

    # -- files --------------------------------------------------------------------------------

    def _write_files(self) -> None:
        for name in ("munge", "state", "spool", "log", "dev"):
            (self.root / name).mkdir(exist_ok=True)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for index in range(GPUS):  # what the NVIDIA driver makes, major 195
            os.mknod(self.root / "dev" / f"nvidia{index}", 0o600 | 0o020000,
                     os.makedev(195, index))
        (self.root / "gres.conf").write_text(
            f"Name=gpu File={self.root}/dev/nvidia[0-{GPUS - 1}]\n")
        (self.root / "plugstack.conf").write_text("")
        ctld_port = free_base_port(2)  # and slurmd's, the next one
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(f"""\
ClusterName=ctetest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={ctld_port + 1}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd.pid
SlurmctldLogFile={self.root}/log/slurmctld.log
SlurmdLogFile={self.root}/log/slurmd.log
SlurmdDebug=debug
PlugStackConfig={self.root}/plugstack.conf
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
SlurmdTimeout=30
Prolog={self.prolog}/*
Epilog={self.epilog}/*
HealthCheckProgram={self.health_check}
HealthCheckInterval={self.health_check_interval}
HealthCheckNodeState=ANY,CYCLE
NodeName={NODE} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 \
CPUs={os.cpu_count()} RealMemory=100 Gres=gpu:{GPUS} State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
""")

    def logs(self) -> str:
        """The daemons' logs' last lines, for a failure's message."""
        out = []
        for path in sorted((self.root / "log").glob("*")):
            lines = path.read_text(errors="replace").splitlines()[-15:]
            out.append(f"== {path.name}\n" + "\n".join(lines))
        return "\n".join(out)

    # -- the client commands ------------------------------------------------------------------

    def run(self, tool: str, *args: str, check: bool = True) -> str:
        done = subprocess.run([self.tools[tool], *args], capture_output=True, text=True,
                              env=self.env, timeout=30, stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise AssertionError(f"{tool} {' '.join(args)}: exit {done.returncode}: "
                                 f"{done.stdout}{done.stderr}\n{self.logs()}")
        return done.stdout

    def node(self) -> str:
        return self.run("scontrol", "show", "node", NODE, "--oneliner", check=False)

    def node_state(self) -> str | None:
        found = re.search(r"\bState=(\S+)", self.node())
        return found.group(1) if found else None

    def drain_reasons(self) -> dict[str, str]:
        """`sinfo -R`: node -> reason, for the drained or down nodes."""
        out = self.run("sinfo", "-R", "-h", "-N", "-o", "%N|%E")
        pairs = (line.split("|", 1) for line in out.splitlines() if "|" in line)
        return {node: reason for node, reason in pairs}

    def reason_stamp(self) -> str | None:
        """Who set the node's reason and when, as Slurm stamps it: root@2026-12-01T10:00:00."""
        found = re.search(r"\bReason=.*\[(\S+@\S+)\]", self.node())
        return found.group(1) if found else None

    def submit(self, *args: str) -> str:
        return self.run("sbatch", "--parsable", "-o", "/dev/null", "-D", str(self.root),
                        *args).strip().split(";")[0]

    def job_state(self, job: str) -> str:
        found = re.search(r"\bJobState=(\S+)", self.run("scontrol", "show", "job", job,
                                                        "--oneliner", check=False))
        return found.group(1) if found else "GONE"

    def job_gpus(self, job: str) -> set[int]:
        """The node's GPU indices Slurm gave the job (`scontrol show job -d`: IDX:0-1,3)."""
        shown = self.run("scontrol", "show", "job", job, "-d")
        found = re.search(r"GRES=gpu[^\s(]*\(IDX:([0-9,-]+)\)", shown)
        assert found, shown
        indices: set[int] = set()
        for part in found.group(1).split(","):
            low, _, high = part.partition("-")
            indices.update(range(int(low), int(high or low) + 1))
        return indices
