"""The fault table: what each health check means, in one place.

Per check: where it judges (a GPU, the node, or each InfiniBand port), the HealthSettings
fields its thresholds come from, the severity and the action of each state it can turn to,
the history's episode kind, and the alerts that fire on its state. Everything else reads
this table: the monitor takes each state's action from it, the history its episode kinds,
scripts/build_health_rules.py writes alerts/gpu-hardware.yml and alerts/fabric.yml from it
(each alert reads the verdict's `gpu_health_check_state` or `gpu_node_health_check_state`,
never a raw counter: the thresholds live in the exporter's config alone), and docs/health.md
renders it.

The XID columns are `xid_judgement`: an XID's state and action (the catalog's rows in
exporter/gpu/xid.py), its severity, and whether it counts in the lemon score. The verdict's
`xid` check, its alerts (through the verdict) and the lemon score read that and nothing else;
the catalog's class words are served as the XID counter's `class` label only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.gpu import xid as catalog
from exporter.health.model import (
    DRAIN_AND_SERVICE,
    FAILED,
    NONE,
    REBOOT_NODE,
    RESET_GPU,
    WARNING,
)
from exporter.health.settings import HealthSettings

GPU, NODE, PORT = "gpu", "node", "port"  # where a check judges: each GPU, the node, each port
# One vocabulary: a state's severity, the same for every check, alert and page finding.
SEVERITY = {FAILED: "critical", WARNING: "warning"}
BY_READING = "by_reading"  # the action depends on what was read (the XID, the driver's ask)
RUNBOOKS = ("https://github.com/cluster-telemetry-exporter/cluster-telemetry-exporter/blob/"
            "main/docs/runbooks.md")
HARDWARE_ACTIONS = catalog.HARDWARE_ACTIONS


def severity(state: str) -> str:
    return SEVERITY.get(state, "info")


@dataclass(frozen=True)
class Alert:
    """An alert on a check's state: it fires while the check is in one of `states` (for
    `wait`), with the severity of that state. The rule file is the check's scope's."""

    name: str
    states: tuple[str, ...]
    summary: str
    description: str
    wait: str = "0s"  # the rule's `for:`

    @property
    def runbook_url(self) -> str:
        return f"{RUNBOOKS}#{self.name.lower()}"


@dataclass(frozen=True)
class Fault:
    check: str
    scope: str
    settings: tuple[str, ...]  # HealthSettings fields the check's thresholds come from
    actions: dict[str, str]  # state -> action (BY_READING: the check's reading says)
    episode: str | None  # the history's episode kind when the check turns warning/failed
    alerts: tuple[Alert, ...] = ()
    note: str = ""  # for the docs: why a check has no alert of its own, or what to know
    severities: dict[str, str] = field(default_factory=lambda: dict(SEVERITY))

    @property
    def file(self) -> str:
        return "fabric.yml" if self.scope == PORT else "gpu-hardware.yml"

    def action(self, state: str, read: str) -> str:
        """The action of `state`: the table's, or the reading's where the table says so."""
        if state not in (WARNING, FAILED):
            return NONE
        fixed = self.actions.get(state, NONE)
        return read if fixed == BY_READING else fixed


# -- texts the alerts share ------------------------------------------------------------
_ON = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"
_AT = "on {{ $labels.instance }} GPU {{ $labels.gpu }}"
_PORT = "{{ $labels.device }}/{{ $labels.port }}"
_PORT_ON = "Port {{ $labels.port }} of {{ $labels.device }} on {{ $labels.instance }}"
_API = " /api/v1/health on the node gives the check's value and threshold."


def _gpu(name: str, states: tuple[str, ...], summary: str, description: str,
         wait: str = "0s") -> Alert:
    return Alert(name, states, summary, f"{_ON} {description}{_API}", wait)


def _port(name: str, states: tuple[str, ...], summary: str, description: str,
          wait: str = "0s") -> Alert:
    return Alert(name, states, f"{summary} on {{{{ $labels.instance }}}} {_PORT}",
                 f"{_PORT_ON}: {description}{_API}", wait)


GPU_HARDWARE_THROTTLING = _gpu(
    "GpuHardwareThrottling", (WARNING,), f"Hardware slowdown {_AT}",
    "has had a hardware slowdown (hw_slowdown, hw_thermal_slowdown or "
    "hw_power_brake_slowdown) holding its clocks down for over a minute (typically halves "
    "clocks or worse).", "1m")

FAULTS: tuple[Fault, ...] = (
    # -- the GPU itself --------------------------------------------------------------
    Fault("gpu_answering", GPU, (), {FAILED: BY_READING}, "gpu_unresponsive", (
        _gpu("GpuLost", (FAILED,), "GPU {{ $labels.gpu }} lost on {{ $labels.instance }}",
             "does not answer NVML (fell off the bus, or stuck in a call).", "1m"),)),
    Fault("xid", GPU, ("xid_hold_seconds",), {WARNING: BY_READING, FAILED: BY_READING}, None, (
        _gpu("GpuXidCritical", (FAILED,), f"Critical XID {_AT}",
             "reported an XID that NVIDIA's catalog answers with a GPU reset, a node reboot or "
             "service; the check holds it for health_xid_hold_seconds after it was last seen. "
             "gpu_xid_errors_total names the code."),
        _gpu("GpuXidWarning", (WARNING,), f"XID (warning) {_AT}",
             "reported an XID that the catalog or DCGM's health watches warn on; the check "
             "holds it for health_xid_hold_seconds after it was last seen. "
             "gpu_xid_errors_total names the code."),
    ), note="an XID is an event the history records as it comes; a failed verdict is a "
            "`health_failed` episode besides"),
    Fault("recovery_action", GPU, (), {WARNING: BY_READING, FAILED: BY_READING},
          None, (
        _gpu("GpuRecoveryActionRequired", (WARNING, FAILED),
             f"NVML asks for a recovery action {_AT}",
             "has a recovery action from the driver (gpu_recovery_action names it): "
             "drain_p2p warns, a reset or reboot is critical."),)),
    # -- memory ------------------------------------------------------------------------
    Fault("ecc_uncorrected", GPU, (), {FAILED: RESET_GPU}, "ecc_dbe", (
        _gpu("GpuEccUncorrectable", (FAILED,), f"Uncorrectable ECC errors {_AT}",
             "has uncorrectable (double-bit) ECC errors since the driver loaded."),)),
    Fault("retired_pages", GPU, ("retired_pages_max",), {FAILED: DRAIN_AND_SERVICE},
          "retired_pages", (
        _gpu("GpuRetiredPagesHigh", (FAILED,), f"Too many retired pages {_AT}",
             "has retired at least health_retired_pages_max memory pages (DCGM: 63)."),)),
    Fault("retired_pages_recent", GPU,
          ("retired_dbe_pages_max", "retired_dbe_new_pages_per_week"),
          {FAILED: DRAIN_AND_SERVICE}, "retired_pages",
          note="GpuHealthFailed pages on it"),
    Fault("retired_pages_pending", GPU, (), {WARNING: RESET_GPU}, "retired_pages",
          note="a warning for the next reset: the page and the API show it"),
    Fault("row_remap_failure", GPU, (), {FAILED: DRAIN_AND_SERVICE}, "row_remap_failure", (
        _gpu("GpuRowRemapFailure", (FAILED,), f"Row remap failure {_AT}",
             "failed to remap an HBM row: the GPU needs replacing (RMA)."),)),
    Fault("row_remap_pending", GPU, (), {WARNING: RESET_GPU}, "row_remap_pending", (
        _gpu("GpuRowRemapPending", (WARNING,), f"Row remap pending {_AT}",
             "has an HBM row remap waiting for the next GPU reset.", "5m"),)),
    Fault("remapped_rows", GPU, ("remapped_rows_uncorrectable_max",), {WARNING: NONE},
          "row_remap_pending",
          note="spare rows run out: plan a service"),
    # -- links ---------------------------------------------------------------------------
    Fault("pcie_replays", GPU, ("pcie_replays_per_lane_per_minute", "window_seconds"),
          {WARNING: NONE}, "pcie_replays", (
        _gpu("GpuPcieReplaysHigh", (WARNING,), f"PCIe replays {_AT}",
             "has more PCIe replays a minute than DCGM's limit for its link "
             "(ceil(per-lane rate x lanes), from health_pcie_replays_per_lane_per_minute).",
             "5m"),)),
    Fault("pcie_link", GPU, ("pcie_load_ratio",), {WARNING: NONE}, "pcie_degraded", (
        _gpu("GpuPcieLinkGenerationDegraded", (WARNING,),
             f"PCIe link below its maximum generation {_AT}",
             "runs its PCIe link below gpu_pcie_link_max_generation while busy (utilization "
             "above health_pcie_load_ratio).", "10m"),)),
    Fault("pcie_link_width", GPU, ("pcie_load_ratio",), {WARNING: NONE}, "pcie_degraded", (
        _gpu("GpuPcieLinkWidthDegraded", (WARNING,),
             f"PCIe link narrower than its maximum {_AT}",
             "runs its PCIe link below gpu_pcie_link_max_width while busy (utilization "
             "above health_pcie_load_ratio).", "10m"),)),
    Fault("nvlink_replays", GPU, ("nvlink_replays_per_minute", "window_seconds"),
          {FAILED: RESET_GPU}, "nvlink_errors", (
        _gpu("GpuNvlinkReplayRecoveryErrors", (FAILED,),
             f"NVLink replay or recovery errors {_AT}",
             "counts NVLink replay or recovery errors over its links at or past "
             "health_nvlink_replays_per_minute a minute (DCGM treats any as a failure)."),)),
    Fault("nvlink_errors", GPU,
          ("nvlink_crc_per_minute", "nvlink_crc_per_second", "window_seconds"),
          {WARNING: NONE, FAILED: RESET_GPU}, "nvlink_errors", (
        _gpu("GpuNvlinkCrcErrors", (WARNING,), f"NVLink CRC errors {_AT}",
             "counts NVLink CRC errors over its links at or past "
             "health_nvlink_crc_per_minute a minute, for 5 minutes.", "5m"),
        _gpu("GpuNvlinkCrcErrorsCritical", (FAILED,), f"NVLink CRC error storm {_AT}",
             "counts NVLink CRC errors over its links at or past "
             "health_nvlink_crc_per_second a second (DCGM's failure limit: 100/s)."),
    )),
    Fault("nvlink_links", GPU, (), {FAILED: RESET_GPU}, "nvlink_degraded", (
        _gpu("GpuNvlinkInactive", (FAILED,), f"Inactive NVLinks {_AT}",
             "has fewer NVLinks up than it should have (gpu_nvlink_links_expected); "
             "gpu_nvlink_link_up (profile full) shows which.", "1m"),)),
    Fault("hw_slowdown", GPU, (), {WARNING: NONE}, "thermal", (GPU_HARDWARE_THROTTLING,)),
    Fault("thermal_violation", GPU, ("window_seconds",), {WARNING: NONE}, "thermal",
          note="any thermal capping, software too: GpuHardwareThrottling is the "
               "hardware's"),
    Fault("power_violation", GPU, ("window_seconds",), {WARNING: NONE}, "thermal",
          note="GpuHardwareThrottling covers the power brake while it holds"),
    Fault("nvlink_fabric", GPU, (), {FAILED: RESET_GPU}, "fabric_degraded",
          note="GpuHealthFailed pages on it"),
    Fault("inforom", GPU, (), {FAILED: DRAIN_AND_SERVICE}, None,
          note="GpuHealthFailed pages on it"),
    # -- the node ----------------------------------------------------------------------
    Fault("gpu_count", NODE, (), {FAILED: REBOOT_NODE}, None, (
        Alert("GpusBelowExpected", (FAILED,),
              "{{ $labels.instance }} has fewer GPUs than expected",
              "{{ $labels.instance }} counts fewer GPUs than gpu_expected_devices "
              "(configured, or counted at start): some vanished from the bus. A GPU still "
              "counted but lost or stuck fires GpuLost." + _API, "1m"),)),
    Fault("nvlink_fabric", NODE, (), {FAILED: BY_READING}, "fabric_degraded",
          note="GpuHealthFailed pages on its GPUs' own nvlink_fabric checks"),
    # -- each InfiniBand/RoCE port (NVSentinel's NIC monitor) -------------------------
    Fault("infiniband_ports", PORT, (), {FAILED: DRAIN_AND_SERVICE, WARNING: NONE},
          "ib_link_down", (
        _port("InfinibandPortDown", (FAILED,), "InfiniBand port down", "DOWN.", "1m"),
        _port("InfinibandPortNotActive", (WARNING,), "InfiniBand port not ACTIVE",
              "stuck in INIT or ARMED: the link is up but the subnet manager has not "
              "activated it.", "5m"),
    )),
    Fault("infiniband_link_downed", PORT, (), {FAILED: DRAIN_AND_SERVICE}, "ib_degraded", (
        _port("InfinibandLinkDowned", (FAILED,), "InfiniBand link went down",
              "failed to recover and went down (link_downed rose) in the last 5 minutes."),)),
    Fault("infiniband_buffer_overrun", PORT, (), {FAILED: DRAIN_AND_SERVICE}, "ib_degraded", (
        _port("InfinibandExcessiveBufferOverrun", (FAILED,), "Excessive buffer overruns",
              "excessive buffer overrun errors in the last 5 minutes."),)),
    Fault("infiniband_link_integrity", PORT, (), {FAILED: DRAIN_AND_SERVICE}, "ib_degraded", (
        _port("InfinibandLocalLinkIntegrityErrors", (FAILED,),
              "Local link integrity errors",
              "local link integrity errors in the last 5 minutes."),)),
    Fault("infiniband_rnr_retry", PORT, (), {FAILED: DRAIN_AND_SERVICE}, "ib_degraded", (
        _port("InfinibandRnrRetryErrors", (FAILED,), "RNR retry errors",
              "RNR NAK retries exceeded in the last 5 minutes (a queue pair went to "
              "error)."),)),
    Fault("infiniband_symbol_errors", PORT, ("infiniband_symbol_errors_per_second",),
          {WARNING: NONE}, "ib_degraded", (
        _port("InfinibandSymbolErrorRate", (WARNING,), "Symbol errors",
              "symbol errors a second over 5 minutes above "
              "health_infiniband_symbol_errors_per_second.", "5m"),)),
    Fault("infiniband_link_error_recovery", PORT,
          ("infiniband_link_error_recovery_per_minute",), {WARNING: NONE}, "ib_degraded", (
        _port("InfinibandLinkErrorRecoveryRate", (WARNING,), "Link error recoveries",
              "link error recoveries a minute over 5 minutes above "
              "health_infiniband_link_error_recovery_per_minute.", "5m"),)),
)
BY_CHECK: dict[tuple[str, str], Fault] = {(f.scope, f.check): f for f in FAULTS}
# the history's episode kind of each check (GPU, node and port checks share names only
# where they mean the same kind)
EPISODES: dict[str, str] = {f.check: f.episode for f in FAULTS if f.episode}

# The verdict's own alert (not one check's): a GPU failed, with the action it needs.
HEALTH_FAILED = Alert(
    "GpuHealthFailed", (FAILED,),
    "GPU {{ $labels.gpu }} on {{ $labels.instance }} needs {{ $labels.action }}: "
    "{{ $labels.reason }}",
    f"{_ON} failed its health checks for over a minute. Action: {{{{ $labels.action }}}}. "
    "Reasons: {{ $labels.reason }}. /api/v1/health on the node gives each check's value, "
    "threshold and source.", "1m")


def fault(scope: str, check: str) -> Fault:
    """The row of a check (a GPU's checks under GPU, the node's under NODE or PORT)."""
    found = BY_CHECK.get((scope, check))
    if found is None and scope == NODE:
        found = BY_CHECK.get((PORT, check))
    if found is None:
        raise KeyError(f"no fault table row for the {scope} check {check}")
    return found


def alerts() -> list[tuple[Alert, Fault]]:
    """Every alert of the table with its check's row, in the table's order."""
    return [(alert, f) for f in FAULTS for alert in f.alerts]


def threshold_settings(settings: HealthSettings) -> dict[str, float]:
    """Each setting any check reads, with its value."""
    return {name: getattr(settings, name) for f in FAULTS for name in f.settings}


# -- XIDs: one column set -----------------------------------------------------------------
@dataclass(frozen=True)
class XidJudgement:
    state: str  # the state the `xid` check takes for it (ok, warning, failed)
    action: str
    severity: str  # critical, warning, info: the alert's and the page's
    lemon: bool  # counts in the lemon score: a fault of the GPU's (a hardware action)


def xid_judgement(code: int) -> XidJudgement:
    """What an XID means to the verdict, the alerts (through the verdict) and the lemon
    score: the catalog row's state and action; it counts against the GPU where it is not
    ok and asks for a reset, a reboot or service."""
    row = catalog.xid_row(code)
    return XidJudgement(row.state, row.action, severity(row.state), row.lemon)
