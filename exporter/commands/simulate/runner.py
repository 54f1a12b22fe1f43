"""The fleet: N fake nodes in one process, each a real exporter on its own port.

Every virtual node runs the production collectors: the fake NVML (its own private
pynvml copy and FakeNvmlLibrary), a generated InfiniBand sysfs tree in a temporary
directory whose counters advance with traffic (fabric.py), and its own job-mapping
directory. All nodes share one clock (the wall clock: the fake's training waveform is
aligned to it, so nodes of one job step in phase and jobs differ by their step period and
phase); fault times count from the fleet's start (once every node's sysfs tree is
written, just before the nodes start sampling).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from exporter.app import Exporter
from exporter.commands.simulate.fabric import NodeFabric
from exporter.commands.simulate.scenario import FleetScenario
from exporter.config import Config
from exporter.gpu.backend import private_nvml_module
from exporter.sim import costs
from exporter.sim.fake import FakeNvmlLibrary

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class FleetSettings:
    base_port: int = 9955
    listen_host: str = "127.0.0.1"
    # every node's settings by config key (simulate's shared flags); unset: the defaults
    options: dict = field(default_factory=dict)
    fabric_update_seconds: float = 2.0


class Fleet:
    """Starts, runs and stops the virtual nodes of a FleetScenario."""

    def __init__(self, scenario: FleetScenario, settings: FleetSettings | None = None,
                 clock=time.time):
        self.scenario = scenario
        self.settings = settings or FleetSettings()
        self.clock = clock
        self.start_time = 0.0
        self.exporters: list[Exporter] = []
        self.fabrics: list[NodeFabric] = []
        self.workdir: Path | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def elapsed(self) -> float:
        return self.clock() - self.start_time

    @property
    def ports(self) -> list[int]:
        return [e.port for e in self.exporters]

    def start(self) -> None:
        sc, st = self.scenario, self.settings
        self.workdir = Path(tempfile.mkdtemp(prefix="cte-fleet-"))
        try:
            # The slow part first (sysfs trees, pynvml copies): fault times count from when
            # the nodes start sampling, not from before their trees were written.
            prepared = [self._prepare_node(node) for node in range(sc.nodes)]
            self.start_time = self.clock()
            for node, (config, nvml) in enumerate(prepared):
                try:
                    self._start_node(node, config, nvml)
                except OSError as exc:  # name the port: which one is busy
                    raise OSError(exc.errno, f"{st.listen_host}:{st.base_port + node}: "
                                  f"{exc.strerror or exc}") from exc
        except BaseException:
            self.stop()
            raise
        self._thread = threading.Thread(target=self._fabric_loop, name="fleet-fabric",
                                        daemon=True)
        self._thread.start()
        log.info("fleet %s: %d nodes x %d GPUs on %s:%d-%d", sc.name, sc.nodes,
                 sc.gpus_per_node, st.listen_host, st.base_port, st.base_port + sc.nodes - 1)

    def _prepare_node(self, node: int) -> tuple[Config, ModuleType]:
        """A node's job mapping, InfiniBand tree, config and pynvml copy."""
        sc, st = self.scenario, self.settings
        assert self.workdir is not None
        base = self.workdir / f"node{node}"
        job = sc.job_of(node)
        jobs_dir = base / "jobs"
        jobs_dir.mkdir(parents=True)
        if job is not None:
            for gpu in range(sc.gpus_per_node):
                (jobs_dir / str(gpu)).write_text(f"{job.name}\n")
        fabric = NodeFabric(base / "sys", node, sc.infiniband,
                            [f for f in sc.ib_faults if f.node == node], job is not None)
        self.fabrics.append(fabric)
        options = {"fake_costs": False, **st.options}
        config = Config.of(
            **options,
            listen_address=f"{st.listen_host}:{st.base_port + node}" if ":" not in
            st.listen_host else f"[{st.listen_host}]:{st.base_port + node}",
            fake=True, scenario=f"{sc.name}/node{node}",
            path_sysfs=str(base / "sys"), collector_host=False,
            hpc_job_mapping_dir=str(jobs_dir), expected_gpus=sc.gpus_per_node)
        return config, private_nvml_module(f"fleet{id(self)}_node{node}")

    def _start_node(self, node: int, config: Config, nvml: ModuleType) -> None:
        # The node's fault times count from the fleet's start: its fake starts then too.
        lib = FakeNvmlLibrary(self.scenario.node_scenario(node), self.clock,
                              costs.H200 if config.backend.fake_costs else None,
                              start=self.start_time)
        exporter = Exporter(config, fake_clock=self.clock, fake_lib=lib, nvml=nvml)
        exporter.start()
        self.exporters.append(exporter)

    def _fabric_loop(self) -> None:
        while not self._stop.wait(self.settings.fabric_update_seconds):
            t = self.elapsed()
            for fabric in self.fabrics:
                try:
                    fabric.update(t)
                except OSError as exc:  # a full disk must not kill the fleet
                    log.warning("fabric update failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        # in parallel: each node's HTTP server takes up to its poll interval to stop
        stoppers = [threading.Thread(target=e.stop, name=f"fleet-stop-{i}")
                    for i, e in enumerate(self.exporters)]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join()
        self.exporters = []
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
