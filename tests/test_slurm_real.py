"""deploy/slurm/ under a real Slurm (tests/slurm_cluster.py: Debian's slurmctld and slurmd,
22.05 on bookworm, one node with eight GPU device files), beside exporters on the fake
node (`run --fake`) on loopback.

Slurm runs prolog.sh and epilog.sh (installed as the README says, in prolog.d/ and
epilog.d/) around real `sbatch --gres=gpu:N` jobs, and health-check.sh as its
HealthCheckProgram every 2 s, each with the environment slurmd makes for it; the
scripts' settings come from their settings file (CTE_SLURM_ENV), as on a real node. The
exporter labels exactly a running job's GPUs with its id, user, account and partition;
the epilog clears them; a failed verdict drains the node through the real scontrol
(`sinfo -R` shows the reason); a recovered one leaves the drain for a person to resume;
a GPU reset drains only while a job runs, by Slurm's own node state.

Root is needed (slurmd, mknod); without it, or without the tools, the module skips
(fails under CTE_REQUIRE_TOOLS=1).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.slurm_cluster import DAEMONS, NODE, PARTITION, SlurmCluster
from tests.tools import REPO, free_port, http_get, require_binary, samples, stop_process, wait_for

SLURM = REPO / "deploy" / "slurm"

# GPU 5 falls off the bus at once (as the gpu-lost scenario, which waits 10 s)
LOST = """
description: GPU 5 falls off the bus half a second in.
gpus: 8
workload: {type: training}
events:
  - {kind: xid, at: 0.5, gpu: 5, code: 79}
  - {kind: error, at: 0.6, gpu: 5, error: GpuIsLost}
"""
# NVML asks for a reset of GPU 2 (as the ecc-dbe scenario, at once)
RESET = """
description: GPU 2 needs a reset half a second in.
gpus: 8
workload: {type: training}
events:
  - {kind: recovery_action, at: 0.5, gpu: 2, action: gpu_reset}
"""

def _cannot(why: str) -> None:
    """Skip, or fail where the tools are required (CI)."""
    if os.environ.get("CTE_REQUIRE_TOOLS") == "1":
        pytest.fail(why)
    pytest.skip(why)


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@dataclass
class Node:
    """The cluster, its exporters (healthy: the jobs collector on; lost; reset) and the
    files the test reads and writes."""

    cluster: SlurmCluster
    ports: dict[str, int]
    configs: dict[str, Path]
    settings: Path
    mapping: Path
    runs: Path  # one line per HealthCheckProgram run: "generation exit-status output"
    syslog: Path
    generation: int = 0
    target: str = "healthy"

    def health_check_points_at(self, name: str) -> int:
        """Which exporter the HealthCheckProgram asks, through the settings file (read
        on every run), replaced atomically; returns the file's new generation."""
        self.generation += 1
        self.target = name
        text = "\n".join([
            f"# generation {self.generation}",
            "# the Slurm scripts' settings (slurmd passes them none of its environment)",
            f"CTE_BIN={self.cluster.root / 'bin' / 'cte'}",
            f'CTE_CONFIG="{self.configs[name]}"',
            "CTE_HEALTH_ARGS='--timeout 3'",
            f"CTE_HPC_JOB_MAPPING_DIR={self.mapping}", ""])
        tmp = self.settings.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.settings)
        return self.generation

    def health_check_runs(self, since: int = 0) -> list[str]:
        """The runs' lines, of the runs that started at generation `since` or later (the
        program reads the settings after the wrapper reads their generation)."""
        lines = self.runs.read_text().splitlines() if self.runs.exists() else []
        pairs = (line.split(" ", 1) for line in lines)
        return [line for generation, line in pairs if int(generation) >= since]

    def next_runs(self, count: int, timeout: float = 20) -> list[str]:
        """The next `count` runs that start after this call."""
        since = self.health_check_points_at(self.target)
        return wait_for(lambda: self.health_check_runs(since)[:count] if len(
            self.health_check_runs(since)) >= count else None, timeout=timeout, interval=0.2)

    def job_series(self) -> dict[str, dict[int, dict[str, str]]]:
        """gpu_hpc_job_info of the healthy exporter: job -> GPU -> its hpc_ labels."""
        found: dict[str, dict[int, dict[str, str]]] = {}
        for sample in samples(http_get(self.ports["healthy"])[1]).get("gpu_hpc_job_info", []):
            labels = sample.labels
            found.setdefault(labels["hpc_job"], {})[int(labels["gpu"])] = {
                k: v for k, v in labels.items() if k.startswith("hpc_") and k != "hpc_job"}
        return found

    def health(self, name: str, *flags: str) -> str:
        """`health --slurm-drain` run by hand against exporter `name`."""
        done = subprocess.run(
            [str(self.cluster.root / "bin" / "cte"), "health", "--slurm-drain",
             f"--web.listen-address=127.0.0.1:{self.ports[name]}", *flags],
            capture_output=True, text=True, timeout=60,
            env={**self.cluster.env, "SLURMD_NODENAME": NODE})
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def resume(self) -> None:
        self.cluster.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME")
        wait_for(lambda: "DRAIN" not in (self.cluster.node_state() or "DRAIN"), timeout=10)


def _start_exporter(root: Path, name: str, scenario: str, config: Path) -> subprocess.Popen:
    log = open(root / "log" / f"exporter-{name}.out", "wb")  # noqa: SIM115 - the child's
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "exporter", "run", "--fake", "--scenario", scenario,
             "--config", str(config), "--log.level", "error", "--no-collector.infiniband",
             "--no-collector.host"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        log.close()


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    if os.geteuid() != 0:
        _cannot("a Slurm node needs root (slurmd, and mknod for its GPU device files)")
    tools = {name: require_binary(name) for name in DAEMONS}
    cluster = SlurmCluster(tools)
    root = cluster.root
    exporters: list = []
    try:
        (root / "log").mkdir()
        bin_dir = root / "bin"
        # the exporter's command from this checkout: slurmd's scripts get no PYTHONPATH
        _executable(bin_dir / "cte", f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} '
                                     '-m exporter "$@"\n')
        # the health check's `logger`, so that the test writes nothing to the system log
        syslog = root / "syslog"
        _executable(bin_dir / "logger", f'#!/bin/sh\n{{ printf "%s " "$@"; cat; }} >> {syslog}\n')
        mapping = root / "hpc-jobs"
        ports = {name: free_port() for name in ("healthy", "lost", "reset")}
        configs = {}
        for name, port in ports.items():
            configs[name] = root / f"{name}.yaml"
            configs[name].write_text(f"listen_address: '127.0.0.1:{port}'\n")
        with configs["healthy"].open("a") as config:
            config.write(f"hpc_job_mapping_dir: '{mapping}'\nsources_interval_seconds: 1\n")
        settings = root / "slurm.env"
        runs = root / "health-check.runs"
        found = Node(cluster, ports, configs, settings, mapping, runs, syslog)
        found.health_check_points_at("healthy")
        # as the README installs them, each with its settings file's path (the one thing
        # that differs from an installed node: there it is the default)
        for kind in ("prolog", "epilog"):
            _executable(root / f"{kind}.d" / "50-cte-hpc-jobs.sh",
                        f"#!/bin/sh\nenv > {root}/{kind}.env.$SLURM_JOB_ID\n"
                        f"CTE_SLURM_ENV={settings} exec {SLURM / kind}.sh\n")
        # the HealthCheckProgram: also this cluster's slurm.conf for scontrol, and PATH for
        # the stand-in logger; each run's exit status and output go to `runs`
        _executable(cluster.health_check, f"""#!/bin/sh
env > {root}/health-check.env
generation=$(sed -n 's/^# generation //p' {settings})
export SLURM_CONF={cluster.conf} CTE_SLURM_ENV={settings} PATH={bin_dir}
out=$({SLURM}/health-check.sh 2>&1)
code=$?
printf '%s %s %s\\n' "$generation" "$code" "$out" >> {runs}
exit "$code"
""")
        for name, scenario in (("healthy", "training"), ("lost", "lost"), ("reset", "reset")):
            if name != "healthy":
                scenario_file = root / f"{name}-scenario.yaml"
                scenario_file.write_text(LOST if name == "lost" else RESET)
                scenario = str(scenario_file)
            exporters.append(_start_exporter(root, name, scenario, configs[name]))
        # slurmd's own environment, which its scripts never see
        try:
            cluster.start(CTE_HPC_JOB_MAPPING_DIR=str(root / "from-slurmd"),
                          CTE_BIN="/from-slurmd")
        except PermissionError as exc:  # a container without CAP_MKNOD
            _cannot(f"cannot make the GPU device files: {exc}")
        for port in ports.values():
            wait_for(lambda port=port: _ready(port), timeout=60, interval=0.2)
        yield found
    finally:
        for proc in exporters:
            stop_process(proc)
        cluster.stop()


def _ready(port: int) -> bool:
    try:
        return http_get(port, "/readyz", timeout=2)[0].status == 200
    except OSError:
        return False


def test_slurmd_runs_the_health_check_program_with_none_of_its_environment(node):
    """Why the scripts read a settings file: slurmd's own variables never reach them."""
    # unknown until the exporter's rates have a window, then ok; never a drain
    ok = "0 ok: 8 GPUs judged (8 ok); slurm: nothing to drain (action none)"
    wait_for(lambda: ok in node.health_check_runs(), timeout=60, interval=0.2)
    assert all(run == ok or run.startswith("0 unknown: ") and run.endswith(
        "; slurm: nothing done (no verdict)") for run in node.health_check_runs())
    env = dict(line.split("=", 1) for line in
               (node.cluster.root / "health-check.env").read_text().splitlines())
    assert env.get("SLURMD_NODENAME") == NODE
    assert "PATH" not in env and not any(name.startswith("CTE_") for name in env), env
    # the line went to the system log too, with its tag
    assert "-t cluster-telemetry-exporter-health ok: 8 GPUs judged" in node.syslog.read_text()


def test_a_job_labels_exactly_its_gpus_while_it_runs_and_the_epilog_clears_them(node):
    cluster = node.cluster
    release = cluster.root / "release"
    wait = f"while [ ! -e {release}.$SLURM_JOB_ID ]; do sleep 0.1; done"
    first = cluster.submit("--gres=gpu:2", "--account=physics", "--wrap", wait)
    second = cluster.submit("--gres=gpu:3", "--wrap", wait)
    try:
        for job in (first, second):
            wait_for(lambda job=job: cluster.job_state(job) == "RUNNING", timeout=20)
        gpus = {first: cluster.job_gpus(first), second: cluster.job_gpus(second)}
        assert len(gpus[first]) == 2 and len(gpus[second]) == 3
        assert not gpus[first] & gpus[second]
        # the prolog got the job's GPUs and who it is from Slurm, none of slurmd's variables
        env = dict(line.split("=", 1) for line in
                   (cluster.root / f"prolog.env.{first}").read_text().splitlines())
        assert env["SLURM_JOB_GPUS"] == ",".join(map(str, sorted(gpus[first])))
        assert "PATH" not in env and "CTE_HPC_JOB_MAPPING_DIR" not in env
        assert not (cluster.root / "from-slurmd").exists()
        user = env["SLURM_JOB_USER"]
        assert user == pwd.getpwuid(os.getuid()).pw_name  # who submitted them
        want = {first: {g: {"hpc_user": user, "hpc_account": "physics",
                            "hpc_partition": PARTITION} for g in gpus[first]},
                # no account asked for, and no accounting: Slurm gives the prolog none
                second: {g: {"hpc_user": user, "hpc_account": "", "hpc_partition": PARTITION}
                         for g in gpus[second]}}
        assert wait_for(lambda: node.job_series() == want and want, timeout=15) == want
        # the first job ends: the epilog takes its GPUs' lines and its attributes away
        (cluster.root / f"release.{first}").touch()
        del want[first]
        assert wait_for(lambda: node.job_series() == want and want, timeout=15) == want
        assert not (node.mapping / ".jobs" / first).exists()
        assert sorted(p.name for p in node.mapping.iterdir() if not p.name.startswith(".")) \
            == sorted(map(str, gpus[second]))
        (cluster.root / f"release.{second}").touch()
        wait_for(lambda: node.job_series() == {}, timeout=15)
        assert [p.name for p in node.mapping.iterdir() if not p.name.startswith(".")] == []
        assert list((node.mapping / ".jobs").iterdir()) == []
        for job in (first, second):
            wait_for(lambda job=job: cluster.job_state(job) in ("COMPLETED", "GONE"),
                     timeout=10)
        # every prolog and epilog succeeded: a failing one would have drained the node
        assert "DRAIN" not in cluster.node_state()
    finally:
        for job in (first, second):
            (cluster.root / f"release.{job}").touch()


def test_a_failed_verdict_drains_the_node_through_the_health_check_program(node):
    cluster = node.cluster
    assert NODE not in cluster.drain_reasons()
    since = node.health_check_points_at("lost")
    try:
        # sinfo -R shows the reason as the run that drained the node wrote it
        def drained() -> tuple[str, str] | None:
            reason = cluster.drain_reasons().get(NODE)
            lines = [r for r in node.health_check_runs(since) if "; slurm: drained" in r]
            return (reason, lines[-1]) if reason and lines else None

        reason, line = wait_for(drained, timeout=20, interval=0.2)
        # (XID 79 is in it once the exporter saw the event before the GPU was lost)
        assert reason.startswith("cte: reboot_node: GPU 5: GPU lost (fell off the bus)")
        assert line == f"0 failed: {reason.removeprefix('cte: ')}; slurm: drained {NODE}"
        state = cluster.node_state()
        assert "DRAIN" in state, state
        # later runs see their own drain and leave it, its time stamp too
        stamp = cluster.reason_stamp()
        later = node.next_runs(1)
        assert later[0].endswith(f"slurm: {NODE} is already drained for this reason"), later
        assert cluster.drain_reasons()[NODE] == reason and cluster.reason_stamp() == stamp
    finally:
        node.health_check_points_at("healthy")


def test_a_recovered_verdict_leaves_the_drain_for_a_person_to_resume(node):
    """deploy/slurm/README.md: it never resumes a node."""
    cluster = node.cluster
    if NODE not in cluster.drain_reasons():  # run alone: drain it as the test above does
        node.health("lost")
    node.health_check_points_at("healthy")
    try:
        runs = node.next_runs(2)
        assert all(r.startswith("0 ok: 8 GPUs judged (8 ok); slurm: nothing to drain")
                   for r in runs), runs
        assert cluster.drain_reasons()[NODE].startswith("cte: reboot_node: GPU 5: GPU lost")
        assert "DRAIN" in cluster.node_state()
        # resumed by a person: the healthy verdict leaves it up
        node.resume()
        node.next_runs(1)
        assert NODE not in cluster.drain_reasons()
        assert cluster.node_state() == "IDLE"
    finally:
        if NODE in cluster.drain_reasons():
            node.resume()


def test_a_gpu_reset_drains_only_while_a_job_runs(node):
    cluster = node.cluster
    assert cluster.node_state() == "IDLE"
    out = node.health("reset")
    assert out.startswith("failed: reset_gpu: GPU 2:") and f"{NODE} runs no job" in out
    assert NODE not in cluster.drain_reasons()
    job = cluster.submit("--gres=gpu:1", "--wrap", "sleep 60")
    try:
        wait_for(lambda: cluster.job_state(job) == "RUNNING", timeout=20)
        state = cluster.node_state()
        assert state in ("MIXED", "ALLOCATED"), state  # as real Slurm says it
        out = node.health("reset")
        assert out.endswith(f"slurm: drained {NODE}\n"), out
        reason = cluster.drain_reasons()[NODE]
        assert reason.startswith("cte: reset_gpu: GPU 2:"), reason
        # the job goes on to its end; no new one starts
        assert cluster.node_state() in ("MIXED+DRAIN", "ALLOCATED+DRAIN")
        assert cluster.job_state(job) == "RUNNING"
    finally:
        cluster.run("scancel", job, check=False)
        wait_for(lambda: cluster.job_state(job) != "RUNNING", timeout=20)
        if NODE in cluster.drain_reasons():
            node.resume()
