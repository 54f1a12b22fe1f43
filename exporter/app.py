"""Wires config, NVML (real, fake or a replayed trace), sampler, renderer and HTTP server."""

from __future__ import annotations

import dataclasses
import logging
import socket
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

import pynvml

from exporter.collectors import registry
from exporter.collectors.registry import CollectorSpec, S
from exporter.config import Config
from exporter.gpu.backend import NvmlBackend
from exporter.health.monitor import HealthMonitor, Published
from exporter.metrics.render import RenderedSnapshot
from exporter.metrics.selection import Selection, load_selection
from exporter.metrics.settings import DCGM_EXPORTER
from exporter.sampling.clock import SYSTEM, Clock
from exporter.sampling.collector_api import Collector
from exporter.sampling.sampler import CollectorMaker, Sampler, SamplerSettings
from exporter.sampling.snapshot import Snapshot
from exporter.sampling.xid_ledger import XidStart
from exporter.web.families import http_families, reload_families, tls_families
from exporter.web.probes import Probes
from exporter.web.server import ExporterHTTPServer, ServerLimits, serve_in_thread
from exporter.web.stats import ReloadStatus
from exporter.web.webconfig import WebConfig, load_web_config

if TYPE_CHECKING:
    from exporter.history.recorder import History
    from exporter.metrics.compat import dcgm
    from exporter.sim import fake

log = logging.getLogger(__name__)


def collector_makers(config: Config, selection: Selection | None = None) -> list[CollectorMaker]:
    """The collectors the config enables (node_exporter-style --collector.NAME), less
    those whose families the metric selection all leaves out."""
    selection = selection or load_selection(config.metrics.profile, config.metrics.file)
    return [_maker(spec, config) for spec in registry.enabled(config.collectors)
            if selection.needs_collector(spec.name)]


def _maker(spec: CollectorSpec[S], config: Config) -> CollectorMaker:
    settings = spec.settings_in(config.collectors)
    return CollectorMaker(
        spec.name, spec.interval_in(config.collectors, config.sampler.sources_interval_seconds),
        lambda context: spec.factory(settings, context))


def sampler_settings(config: Config, selection: Selection | None = None) -> SamplerSettings:
    """The config's sampler settings, told what stands in for NVML and which NVLink
    fields the metric selection needs."""
    selection = selection or load_selection(config.metrics.profile, config.metrics.file)
    return dataclasses.replace(config.sampler, backend=config.backend.name,
                               scenario=config.backend.scenario_name,
                               nvlink_reads=selection.nvlink_reads(),
                               kmsg_path=config.history.kernel_log(config.backend.name))


def compat_summary(config: Config, selection: Selection) -> str:
    """The start's one line on dcgm-exporter compatibility: what is served, what not."""
    from exporter.metrics.compat import dcgm

    reads = selection.nvlink_reads()
    profiling = any(s.name == "profiling" for s in registry.enabled(config.collectors))
    return dcgm.summary(profiling, reads.traffic, reads.errors)


class Exporter:
    """One running exporter: sampling threads plus the HTTP server."""

    def __init__(self, config: Config,
                 collectors: list[Collector | CollectorMaker] | None = None,
                 fake_clock: Callable[[], float] | None = None,
                 limits: ServerLimits | None = None, nvml: ModuleType = pynvml,
                 fake_lib: fake.FakeNvmlLibrary | None = None, clock: Clock = SYSTEM):
        """Raises ConfigError for a bad web config or selection file, before anything
        starts.

        `nvml` and `fake_lib` let the fleet simulator run many fake nodes in one process:
        each gets a private pynvml copy and a fake library built for it. `collectors`,
        when given, replace the ones the config enables."""
        self.config = config
        self.fake_clock = fake_clock  # the fake node's clock (tests run scenarios faster)
        self.clock = clock
        self.nvml = nvml
        self.web: WebConfig = load_web_config(config.serving.web_config_file)
        self.selection: Selection = load_selection(config.metrics.profile,
                                                   config.metrics.file)
        self.reloads = ReloadStatus()
        self.limits = limits
        self.current: RenderedSnapshot | None = None
        self.compat: dcgm.DcgmCompat | None = None
        if config.metrics.compat == DCGM_EXPORTER:  # its module and tables only then
            from exporter.metrics.compat import dcgm

            self.compat = dcgm.DcgmCompat(hostname_label=config.metrics.compat_hostname_label)
        self.health = HealthMonitor(config.health)
        self.fake_lib = fake_lib
        self._collectors_from_config = collectors is None
        self.collectors: list[Collector | CollectorMaker] = (
            collectors if collectors is not None
            else list(collector_makers(config, self.selection)))
        self.sampler: Sampler | None = None
        self.server: ExporterHTTPServer | None = None
        self.history: History | None = None
        self.history_problem = ""  # why there is no history although one was asked for

    def _publish(self, snapshot: Snapshot) -> None:
        """The sampler's publisher: the snapshot judged once, the goodput account's newest
        second settled with that verdict, and both published as one value that every
        reader (metrics, compat, the API, the page, the history) takes."""
        sampler = self.sampler
        assert sampler is not None  # it calls this
        history = self.history
        if history is not None:  # the GPUs' identities (a GPU replaced in its slot)
            history.observe(snapshot)
        verdict = self.health.assess(snapshot)
        published = Published(sampler.settle(snapshot, verdict.failed_gpus()), verdict)
        if history is not None:  # a verdict that turned failed is an episode
            history.observe_health(verdict)
        # rendered by its first scrape, with the serving side's own figures as of then
        self.current = RenderedSnapshot(published, self._serving_families, self.selection,
                                        self.compat)

    def _serving_families(self) -> list:
        server = self.server
        serving = list(http_families(server.stats())) if server is not None else []
        serving += reload_families(self.reloads.stats())
        serving += tls_families(self.web.certificate_not_after)
        if self.history is not None:
            from exporter.history.families import history_families

            serving += history_families(self.history, self.clock.time())
        return serving

    def _problems(self) -> list[str]:
        """The kernel log's and the history's degraded states, for /readyz."""
        out = self.sampler.xids.problems() if self.sampler is not None else []
        if self.history is not None:
            return out + self.history.problems()
        return out + ([self.history_problem] if self.history_problem else [])

    def _open_history(self, sampler: Sampler) -> None:
        """The state directory's history, if one is configured, handing the sampler its
        XID counts; without one, the sampler counts from zero and reads the kernel log from
        its end. Raises StoreBusy (another exporter holds it); any other failure leaves the
        exporter running without."""
        h = self.config.history
        directory = h.directory(self.config.backend.name)
        if not directory:
            sampler.xids.begin(XidStart(), None)
            return
        # the history's modules only with a state directory (the fake keeps none)
        from exporter.history.recorder import History
        from exporter.history.store import Store, StoreError

        store = Store(directory, self.clock.time)
        try:
            store.open()
        except StoreError as exc:
            self.history_problem = f"history off: {exc}"
            log.warning("%s", self.history_problem)
            sampler.xids.begin(XidStart(kmsg_from_end=self.history_problem), None)
            return
        history = History(store, socket.gethostname(), clock=self.clock.time,
                          reads_kernel_log=sampler.xids.kernel_log is not None,
                          boot_id_path=h.boot_id_path)
        history.load()
        sampler.xids.begin(history.begin(sampler.gpus.identities,
                                         sampler.backend.driver_version), history)
        self.history = history
        log.info("history in %s", directory)

    # -- what a reload (SIGHUP, exporter/service.py) needs ---------------------------
    def apply_web_config(self, web: WebConfig) -> None:
        """New certificates and users for new connections and requests, in one swap."""
        self.web = web
        if self.server is not None:
            self.server.set_web_config(web)

    def apply_selection(self, selection: Selection) -> list[str]:
        """Families served from the next snapshot on; NVLink fields read from the next
        device read on; the collectors the config enables that the selection now needs
        and that were left out, started (their names). A collector no longer needed
        goes on reading: its families are left out of the output."""
        self.selection = selection
        if self.sampler is None:
            return []
        self.sampler.sweep.nvlink_reads = selection.nvlink_reads()
        if not self._collectors_from_config:
            return []
        return self.sampler.add_collectors(collector_makers(self.config, selection))

    def record_reload(self, ok: bool) -> None:
        self.reloads.record(ok)

    def alive(self) -> bool:
        """Liveness, as /healthz says it: the publisher builds fresh snapshots."""
        server = self.server
        return server is not None and not server.probes.liveness(self.current)

    def _install_fake(self) -> None:
        b = self.config.backend
        if self.fake_lib is None and not (b.replay or b.fake):
            return  # real NVML: the simulator's modules are never imported
        # imported here: on real hardware neither the simulator nor trace loading is needed
        from exporter.sim import costs, fake
        from exporter.sim.scenarios import load_scenario

        model = costs.H200 if b.fake_costs else None
        clock = self.fake_clock or self.clock.time
        if self.fake_lib is not None:
            pass  # built by the caller (the fleet simulator)
        elif b.replay:  # trace loading only for a replay (~0.5 MiB the fake never needs)
            from exporter.sim.replay import replay_library
            from exporter.traces.load import load_trace

            self.fake_lib = replay_library(load_trace(b.replay), b.replay_speed, clock, model)
        elif b.fake:
            self.fake_lib = fake.FakeNvmlLibrary(load_scenario(b.scenario), clock, model)
        if self.fake_lib is not None:
            fake.install(self.fake_lib, self.nvml)

    def start(self, threads: bool = True) -> None:
        """Start sampling and serving; raises NvmlUnavailable, OSError (port in use) or
        StoreBusy (another exporter holds the state directory)."""
        c = self.config
        self._install_fake()
        settings = sampler_settings(c, self.selection)
        try:
            self.sampler = Sampler(NvmlBackend(self.nvml), settings, self.collectors,
                                   on_snapshot=self._publish, clock=self.clock)
            self.sampler.open()  # NvmlUnavailable before any state directory is touched
            self._open_history(self.sampler)  # StoreBusy: another exporter holds it
            self.sampler.start(threads)
            self.server = ExporterHTTPServer(c.host_port, lambda: self.current,
                                             Probes(c.serving.stale_after_seconds,
                                                         self.clock.time, self._problems),
                                             self.web, self.limits, history=self.history)
            if self.history is not None and threads:
                self.history.start()
        except BaseException:
            self.stop()
            raise
        serve_in_thread(self.server)
        host, port = self.server.server_address[:2]
        log.info("serving on %s:%s (%s%s; %d GPUs, backend %s)", host, port,
                 "TLS" if self.web.tls else "plain HTTP",
                 ", basic auth" if self.web.auth else "", self.sampler.gpu_count, settings.backend)
        if self.compat is not None:
            log.info("%s", compat_summary(c, self.selection))

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
        if self.history is not None:
            self.history.stop()  # writes what is pending
            self.history = None
        if self.fake_lib is not None:
            from exporter.sim import fake

            fake.uninstall(self.nvml)
            self.fake_lib = None

