"""Wires config, NVML (real or fake), sampler, renderer and HTTP server together."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import ModuleType

import pynvml

from exporter.analysis.live_stragglers import StragglerSettings
from exporter.collectors.host import HostSource
from exporter.collectors.infiniband import InfinibandSource
from exporter.collectors.jobs import JobsSource
from exporter.config import Config
from exporter.gpu.backend import NvmlBackend
from exporter.metrics.render import RenderedSnapshot
from exporter.metrics.web import http_families, reload_families, tls_families
from exporter.offline.trace import load_trace
from exporter.sampling.sampler import Sampler, SamplerSettings, Snapshot, Source
from exporter.sim import fake
from exporter.sim.replay import replay_library
from exporter.sim.scenarios import Scenario, load_scenario
from exporter.web.health import HealthCheck
from exporter.web.server import ExporterHTTPServer, ServerLimits, serve_in_thread
from exporter.web.stats import ReloadStatus
from exporter.web.webconfig import WebConfig, load_web_config

log = logging.getLogger(__name__)


def default_sources(config: Config) -> list[Source]:
    """The non-NVML sources the config enables (node_exporter-style --collector.NAME)."""
    sources: list[Source] = []
    if config.collector_infiniband:
        sources.append(InfinibandSource(config.path_sysfs))
    if config.collector_host:
        sources.append(HostSource(config.host_network_exclude))
    if config.hpc_job_mapping_dir is not None:
        sources.append(JobsSource(config.hpc_job_mapping_dir))
    return sources


class Exporter:
    """One running exporter: sampling threads plus the HTTP server."""

    def __init__(self, config: Config, sources: list[Source] | None = None,
                 fake_clock: Callable[[], float] | None = None,
                 limits: ServerLimits | None = None, nvml: ModuleType = pynvml,
                 scenario: Scenario | None = None):
        """Raises ConfigError for a bad web config file, before anything starts.

        `nvml` and `scenario` let the fleet simulator run many fake nodes in one process:
        each gets a private pynvml copy and a scenario built for it."""
        self.config = config
        self.fake_clock = fake_clock  # the fake node's clock (tests run scenarios faster)
        self.nvml = nvml
        self.scenario = scenario
        self.web: WebConfig = load_web_config(config.web_config_file)
        self.reloads = ReloadStatus()
        self.limits = limits
        self.current: RenderedSnapshot | None = None
        self.fake_lib: fake.FakeNvmlLibrary | None = None
        self.sources = sources if sources is not None else default_sources(config)
        self.sampler: Sampler | None = None
        self.server: ExporterHTTPServer | None = None

    def _publish(self, snapshot: Snapshot) -> None:
        # rendered here, with the serving side's own figures, then one atomic swap
        server = self.server
        serving = list(http_families(server.stats())) if server is not None else []
        serving += reload_families(self.reloads.stats())
        serving += tls_families(self.web.certificate_not_after)
        self.current = RenderedSnapshot(snapshot, serving)

    # -- what a reload (SIGHUP, exporter/service.py) needs ---------------------------
    def apply_web_config(self, web: WebConfig) -> None:
        """New certificates and users for new connections and requests, in one swap."""
        self.web = web
        if self.server is not None:
            self.server.set_web_config(web)

    def record_reload(self, ok: bool) -> None:
        self.reloads.record(ok)

    def alive(self) -> bool:
        """Liveness, as /healthz says it: the publisher builds fresh snapshots."""
        server = self.server
        return server is not None and not server.health.liveness(self.current)

    def start(self) -> None:
        """Start sampling and serving; raises NvmlUnavailable or OSError (port in use)."""
        c = self.config
        if c.replay:
            self.fake_lib = replay_library(load_trace(c.replay), c.replay_speed,
                                           self.fake_clock or time.time)
            fake.install(self.fake_lib, self.nvml)
        elif c.fake:
            self.fake_lib = fake.FakeNvmlLibrary(self.scenario or load_scenario(c.scenario),
                                                 self.fake_clock or time.time)
            fake.install(self.fake_lib, self.nvml)
        settings = SamplerSettings(
            power_hertz=c.power_sample_rate_hz,
            sweep_interval_seconds=c.sweep_interval_seconds,
            sources_interval_seconds=c.sources_interval_seconds,
            backend="replay" if c.replay else "fake" if c.fake else "nvml",
            scenario=c.replay if c.replay else c.scenario if c.fake else "",
            expected_gpus=c.expected_gpus,
            hang_timeout_seconds=c.hang_timeout_seconds,
            recovery_interval_seconds=c.gpu_recovery_interval_seconds,
            health_interval_seconds=c.gpu_health_interval_seconds,
            stragglers=StragglerSettings(persistence_seconds=c.straggler_persistence_seconds),
        )
        try:
            self.sampler = Sampler(NvmlBackend(self.nvml), settings, self.sources, self._publish)
            self.sampler.start()
            self.server = ExporterHTTPServer(c.host_port, lambda: self.current,
                                             HealthCheck(c.stale_after_seconds), self.web,
                                             self.limits)
        except BaseException:
            self.stop()
            raise
        serve_in_thread(self.server)
        host, port = self.server.server_address[:2]
        log.info("serving on %s:%s (%s%s; %d GPUs, backend %s)", host, port,
                 "TLS" if self.web.tls else "plain HTTP",
                 ", basic auth" if self.web.auth else "", self.sampler.gpu_count, settings.backend)

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.server_address[1]

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.fake_lib is not None:
            self.fake_lib.release_hangs()
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        if self.fake_lib is not None:
            fake.uninstall(self.nvml)
            self.fake_lib = None
