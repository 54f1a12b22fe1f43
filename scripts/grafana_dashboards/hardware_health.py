"""GPU hardware health: the health verdict, lost GPUs, XIDs, ECC, row remapping, retired
pages, interconnect."""

from __future__ import annotations

from .common import (
    ORANGE_ABOVE_0,
    PCIE_REPLAYS_LIMIT,
    RED_ABOVE_0,
    RI,
    G,
    Item,
    N,
    bargauge,
    dashboard,
    row,
    stat,
    table,
    ts,
    variables,
)

FILE = "hardware-health.json"


def verdict() -> list[Item]:
    """The exporter's own health verdict (docs/health.md): GPUs by state, and the GPUs
    that need something with the action and the reasons."""
    return [
        row("Health verdict"),
        stat("GPUs by health verdict",
             (f"sum by (state) (gpu_health_state{{{G}, state=~\"ok|warning|failed|unknown\"}})",
              "{{state}}"), w=8, h=6,
             description="The worst of each GPU's checks, as the exporter judges it on the node "
                         "by NVIDIA's thresholds (DCGM health watches, the XID catalog)."),
        table("GPUs that need action",
              (f"gpu_health_action{{{G}}} and on (cluster, job, instance, gpu, uuid) "
               f"(gpu_health_state{{{G}, state=~\"warning|failed|unknown\"}} == 1)", ""),
              w=16, h=6, hide=("Time", "__name__", "job", "uuid", "Value"),
              description="Each GPU whose verdict is not ok: the action it needs "
                          "(restart_application, reset_gpu, reboot_node, drain_and_service) "
                          "and its reasons. /api/v1/health on the node gives every check."),
    ]


def availability() -> list[Item]:
    return [
        row("Availability"),
        stat("Lost GPUs", (f"count(gpu_up{{{G}}} == 0) or on() vector(0)", "lost"),
             thresholds=RED_ABOVE_0),
        stat("XID codes seen in range",
             (f"count by (class) (gpu_xid_last_seen_timestamp_seconds{{{G}}} "
              f"> time() - $__range_s)", "{{class}}"), w=8, thresholds=ORANGE_ABOVE_0),
        bargauge("Recovery action requested",
                 (f"count by (action) (gpu_recovery_action{{{G}}} == 1)", "{{action}}"),
                 w=6, h=4, description="What NVML asks for (`none` when all is well)."),
        stat("Row remaps and page retirements",
             (f"sum(gpu_row_remap_pending{{{G}}})", "remap pending"),
             (f"sum(gpu_row_remap_failure{{{G}}})", "remap failed"),
             (f"sum(gpu_retired_pages_pending{{{G}}})", "retirement pending"),
             w=6, thresholds=ORANGE_ABOVE_0,
             description="Pending: needs a GPU reset. Remap failed: replace the GPU."),
        table("GPUs down", (f"gpu_up{{{G}}} == 0", ""), w=12, h=6,
              hide=("Time", "__name__", "job", "Value")),
        ts("GPUs up per node", (f"sum by (instance) (gpu_up{{{N}}})", "{{instance}} up"),
           (f"gpu_expected_devices{{{N}}}", "{{instance}} expected"), h=6),
    ]


def xids() -> list[Item]:
    xid_new = (f"sum by (class) (increase(gpu_xid_errors_total{{{G}}}[{RI}]) or "
               f"(gpu_xid_errors_total{{{G}}} unless gpu_xid_errors_total{{{G}}} offset {RI}))")
    return [
        row("XIDs"),
        ts("XIDs by class", (xid_new, "{{class}}"), bars=True, stack=True,
           description="New XID events per interval; an XID's first event counts too."),
        table("XIDs (since driver load)",
              (f"gpu_xid_errors_total{{{G}}}", ""),
              (f"gpu_xid_last_seen_timestamp_seconds{{{G}}} * 1000", ""), merge=True,
              hide=("Time", "__name__", "job", "uuid"),
              description="Value #A: count; Value #B: last seen (ms since epoch)."),
    ]


def memory() -> list[Item]:
    return [
        row("Memory: ECC, row remapping, retired pages"),
        ts("ECC errors (volatile)",
           (f"sum by (instance, gpu, type) (increase(gpu_ecc_errors_total{{{G}, "
            f"scope=\"volatile\"}}[{RI}]))", "{{instance}} GPU {{gpu}} {{type}}"), bars=True),
        table("ECC errors (aggregate, lifetime)",
              (f"gpu_ecc_errors_total{{{G}, scope=\"aggregate\"}} > 0 or "
               f"sum by (cluster, instance) (gpu_ecc_errors_total{{{N}, scope=\"aggregate\"}})",
               ""), hide=("Time", "__name__", "job", "uuid", "scope"),
              description="GPUs with lifetime ECC errors, and each node's total."),
        table("Remapped rows", (f"gpu_remapped_rows_total{{{G}}} > 0 or sum by (cluster, "
                                f"instance, type) (gpu_remapped_rows_total{{{N}}})", ""),
              hide=("Time", "__name__", "job", "uuid")),
        table("Retired pages", (f"gpu_retired_pages_total{{{G}}} > 0 or sum by (cluster, "
                                f"instance, cause) (gpu_retired_pages_total{{{N}}})", ""),
              hide=("Time", "__name__", "job", "uuid"),
              description="Pre-Hopper page retirement; DCGM's threshold is 63 pages."),
    ]


def interconnect() -> list[Item]:
    return [
        row("Interconnect"),
        ts("NVLink errors", (f"sum by (instance, gpu, type) (rate(gpu_nvlink_errors_total{{{G}}}"
                             f"[{RI}])) > 0", "{{instance}} GPU {{gpu}} {{type}}"), unit="cps",
           description="Only links with errors in the interval are shown."),
        ts("NVLinks down", (f"sum by (instance) (gpu_nvlink_links_expected{{{G}}} - "
                            f"gpu_nvlink_links_active{{{G}}})", "{{instance}}"),
           thresholds=RED_ABOVE_0),
        ts("PCIe replays per minute", (f"sum by (instance, gpu) (rate(gpu_pcie_replays_total"
                                       f"{{{G}}}[{RI}])) * 60", "{{instance}} GPU {{gpu}}"),
           description=PCIE_REPLAYS_LIMIT),
        ts("Throttling GPUs by reason",
           (f"sum by (reason) (gpu_clock_event_active{{{G}, reason=~\"sw_power_cap|hw_slowdown|"
            f"sw_thermal_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown\"}})",
            "{{reason}}"), stack=True,
           description="GPUs with each throttle reason active (idle and sync boost left out)."),
    ]


def board():
    return dashboard(
        "cte-hardware-health", "GPU hardware health",
        "Lost GPUs, XIDs by class, ECC, row remapping, retired pages, NVLink and PCIe "
        "errors, throttling.", [*verdict(), *availability(), *xids(), *memory(),
                                *interconnect()],
        variables())
