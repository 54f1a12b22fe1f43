"""Build the Grafana dashboards in dashboards/*.json from one description.

The JSON files are committed (Grafana imports them as they are); this script is how
they are written, so the five dashboards share one datasource variable, one set of
template variables and one layout. `tests/test_dashboards.py` checks that the files
match its output. Run after editing: `python scripts/build_dashboards.py`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DS = {"type": "prometheus", "uid": "${datasource}"}
OUT = Path(__file__).resolve().parent.parent / "dashboards"

# Label selectors shared by the queries. The `cluster` label is added to every target
# by the scrape config (see dashboards/README.md); with "All" the regex is `.*`, which
# also matches series without the label.
C = 'cluster=~"$cluster"'
N = f'{C}, instance=~"$instance"'
G = f'{N}, gpu=~"$gpu"'
JOIN = "on(cluster, instance, gpu, uuid) group_left()"
RI = "$__rate_interval"


# --- template variables ---------------------------------------------------------------

def datasource_var() -> dict:
    return {"name": "datasource", "label": "Data source", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0, "refresh": 1,
            "regex": "", "options": [], "includeAll": False, "multi": False}


def query_var(name: str, label: str, query: str, *, include_all: bool = True,
              multi: bool = True) -> dict:
    var = {"name": name, "label": label, "type": "query", "datasource": DS,
           "definition": query, "query": {"query": query, "refId": f"{name}-values"},
           "refresh": 2, "sort": 3 if name == "gpu" else 1, "regex": "", "hide": 0,
           "includeAll": include_all, "multi": multi, "current": {}, "options": []}
    if include_all:
        var["allValue"] = ".*"
    return var


def variables(*, single_instance: bool = False, extra: list[dict] | None = None) -> list[dict]:
    return [
        datasource_var(),
        query_var("cluster", "Cluster", "label_values(gpu_up, cluster)"),
        query_var("hpc_job", "Job", f"label_values(gpu_hpc_job_info{{{C}}}, hpc_job)"),
        query_var("instance", "Node", f"label_values(gpu_up{{{C}}}, instance)",
                  include_all=not single_instance, multi=not single_instance),
        query_var("gpu", "GPU", f"label_values(gpu_up{{{N}}}, gpu)"),
        *(extra or []),
    ]


# --- panels ---------------------------------------------------------------------------

def target(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False,
           table: bool = False) -> dict:
    t = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend or "__auto",
         "range": not instant, "instant": instant, "editorMode": "code"}
    if table:
        t["format"] = "table"
    return t


def targets(*pairs: tuple[str, str], instant: bool = False, table: bool = False) -> list[dict]:
    return [target(expr, legend, chr(ord("A") + i), instant=instant, table=table)
            for i, (expr, legend) in enumerate(pairs)]


def panel(kind: str, title: str, tgts: list[dict], *, w: int = 12, h: int = 8,
          unit: str = "short", description: str = "", custom: dict | None = None,
          options: dict | None = None, mappings: list | None = None,
          thresholds: list | None = None, minimum: float | None = None,
          maximum: float | None = None, transformations: list | None = None) -> dict:
    defaults: dict = {"unit": unit, "mappings": mappings or [],
                      "thresholds": {"mode": "absolute", "steps": thresholds or [
                          {"color": "green", "value": None}]},
                      "color": {"mode": "palette-classic" if kind == "timeseries"
                                else "thresholds"}}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if custom:
        defaults["custom"] = custom
    p = {"type": kind, "title": title, "description": description, "datasource": DS,
         "targets": tgts, "fieldConfig": {"defaults": defaults, "overrides": []},
         "options": options or {}, "_size": (w, h)}
    if transformations:
        p["transformations"] = transformations
    return p


def ts(title: str, *pairs: tuple[str, str], unit: str = "short", description: str = "",
       bars: bool = False, stack: bool = False, **kw) -> dict:
    custom = {"drawStyle": "bars" if bars else "line", "lineWidth": 1,
              "fillOpacity": 60 if bars else 10, "showPoints": "never", "spanNulls": False,
              "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
    options = {"legend": {"displayMode": "table", "placement": "right", "showLegend": True,
                          "calcs": ["lastNotNull", "max"]},
               "tooltip": {"mode": "multi", "sort": "desc"}}
    return panel("timeseries", title, targets(*pairs), unit=unit, description=description,
                 custom=custom, options=options, **kw)


def stat(title: str, *pairs: tuple[str, str], unit: str = "short", description: str = "",
         w: int = 4, h: int = 4, **kw) -> dict:
    options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
               "colorMode": "background", "graphMode": "area", "justifyMode": "auto",
               "textMode": "value_and_name", "orientation": "auto"}
    return panel("stat", title, targets(*pairs), unit=unit, description=description,
                 options=options, w=w, h=h, **kw)


def table(title: str, *pairs: tuple[str, str], unit: str = "short", description: str = "",
          merge: bool = False, hide: tuple[str, ...] = ("Time", "__name__", "job"),
          **kw) -> dict:
    transformations = []
    if merge:
        transformations.append({"id": "merge", "options": {}})
    transformations.append({"id": "organize", "options": {
        "excludeByName": dict.fromkeys(hide, True), "indexByName": {}, "renameByName": {}}})
    return panel("table", title, targets(*pairs, instant=True, table=True), unit=unit,
                 description=description, transformations=transformations,
                 options={"showHeader": True, "cellHeight": "sm"}, **kw)


def timeline(title: str, *pairs: tuple[str, str], mappings: list | None = None,
             thresholds: list | None = None, description: str = "", **kw) -> dict:
    options = {"showValue": "auto", "mergeValues": True, "rowHeight": 0.9,
               "alignValue": "left", "legend": {"showLegend": True, "displayMode": "list",
                                                "placement": "bottom"},
               "tooltip": {"mode": "single", "sort": "none"}}
    return panel("state-timeline", title, targets(*pairs), description=description,
                 options=options, mappings=mappings, thresholds=thresholds,
                 custom={"lineWidth": 0, "fillOpacity": 80}, **kw)


def bargauge(title: str, *pairs: tuple[str, str], unit: str = "short", description: str = "",
             **kw) -> dict:
    options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
               "orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True,
               "valueMode": "color", "namePlacement": "auto", "sizing": "auto",
               "minVizWidth": 8, "minVizHeight": 16}
    return panel("bargauge", title, targets(*pairs, instant=True), unit=unit,
                 description=description, options=options, **kw)


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (24, 1)}


UP_DOWN = [{"type": "value", "options": {
    "0": {"text": "down", "color": "red", "index": 0},
    "1": {"text": "up", "color": "green", "index": 1}}}]
ON_OFF = [{"type": "value", "options": {
    "0": {"text": "no", "color": "transparent", "index": 0},
    "1": {"text": "yes", "color": "orange", "index": 1}}}]
RED_ABOVE_0 = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
ORANGE_ABOVE_0 = [{"color": "green", "value": None}, {"color": "orange", "value": 1}]
PORT_STATE = [{"type": "value", "options": {
    "1": {"text": "down", "color": "red", "index": 0},
    "2": {"text": "init", "color": "orange", "index": 1},
    "3": {"text": "armed", "color": "yellow", "index": 2},
    "4": {"text": "active", "color": "green", "index": 3},
    "5": {"text": "active defer", "color": "blue", "index": 4}}}]
PHYS_STATE = [{"type": "value", "options": {
    "1": {"text": "sleep", "color": "purple", "index": 0},
    "2": {"text": "polling", "color": "orange", "index": 1},
    "3": {"text": "disabled", "color": "red", "index": 2},
    "4": {"text": "training", "color": "yellow", "index": 3},
    "5": {"text": "link up", "color": "green", "index": 4},
    "6": {"text": "error recovery", "color": "orange", "index": 5},
    "7": {"text": "phy test", "color": "blue", "index": 6}}}]
NO_ALERTS = 'or on() label_replace(vector(0), "severity", "none", "", "")'


# --- dashboards -----------------------------------------------------------------------

def cluster_overview() -> list[dict]:
    return [
        row("Fleet"),
        stat("GPUs up", (f"sum(gpu_up{{{C}}})", "up"),
             description="GPUs answering NVML, over the selected clusters."),
        stat("GPUs expected", (f"sum(gpu_expected_devices{{{C}}})", "expected"),
             description="GPUs the nodes should have (config `expected_gpus`, else the "
                         "count NVML reported at start)."),
        stat("GPUs missing or lost",
             (f"sum(gpu_expected_devices{{{C}}}) - sum(gpu_up{{{C}}})", "missing"),
             thresholds=RED_ABOVE_0,
             description="Expected minus up: lost (`GpuIsLost`), hung, or gone from the bus."),
        stat("Exporters up / down", (f"sum(up{{{C}}})", "up"),
             (f"count(up{{{C}}}) - sum(up{{{C}}})", "down"),
             description="Scrape targets answering (Prometheus' own `up`)."),
        stat("Firing alerts", (f"count by (severity) (ALERTS{{alertstate=\"firing\", {C}}}) "
                               f"{NO_ALERTS}", "{{severity}}"),
             w=8, thresholds=ORANGE_ABOVE_0,
             description="Alerts firing now, by severity (`none` when nothing fires)."),
        ts("GPUs up vs expected by cluster",
           ('cluster:gpus_up:sum{cluster=~"$cluster"}', "{{cluster}} up"),
           ('cluster:gpus_expected:sum{cluster=~"$cluster"}', "{{cluster}} expected"),
           description="Recording rules `cluster:gpus_up:sum` and `cluster:gpus_expected:sum`."),
        ts("Firing alerts by severity",
           (f"count by (severity) (ALERTS{{alertstate=\"firing\", {C}}}) {NO_ALERTS}",
            "{{severity}}"), stack=True),
        row("Power"),
        stat("GPU power now", (f"sum(gpu_power_watts{{{C}}})", "power"), unit="watt", w=6,
             description="Sum of the GPUs' instant power (board power, not wall power)."),
        stat("Coherent swing now",
             ('sum(cluster:power_swing_coherent_amplitude_watts:estimate{cluster=~"$cluster"})',
              "coherent swing"), unit="watt", w=6,
             description="Peak-to-peak swing the grid sees when nodes swing in phase "
                         "(`cluster:power_swing_coherent_amplitude_watts:estimate`)."),
        stat("Nodes swinging in step", (f"sum(power_swing_active{{{C}}})", "nodes"), w=6,
             thresholds=ORANGE_ABOVE_0,
             description="Nodes whose GPUs swing together at >= 20 % of TDP in 0.1-3 Hz."),
        bargauge("Swing amplitude by node (top 10)",
                 (f"topk(10, power_swing_amplitude_watts{{{N}}})", "{{instance}}"),
                 unit="watt", w=6, h=4),
        ts("Total power by cluster",
           ('cluster:gpu_power_watts:sum{cluster=~"$cluster"}', "{{cluster}}"), unit="watt"),
        ts("Power by job", ('hpc_job:gpu_power_watts:sum{hpc_job=~"$hpc_job"}', "{{hpc_job}}"),
           unit="watt", description="Recording rule `hpc_job:gpu_power_watts:sum`."),
        ts("Coherent swing estimate by cluster",
           ('cluster:power_swing_coherent_amplitude_watts:estimate{cluster=~"$cluster"}',
            "{{cluster}} coherent"),
           ('cluster:power_swing_amplitude_watts:sum{cluster=~"$cluster"}',
            "{{cluster}} sum of node amplitudes"),
           unit="watt",
           description="The coherent estimate is what adds up on the feeder; the plain sum "
                       "is the worst case (every node in phase)."),
        ts("Phase coherence by cluster",
           ('cluster:power_swing_phase_coherence:ratio{cluster=~"$cluster"}', "{{cluster}}"),
           unit="percentunit", minimum=0, maximum=1),
        row("Stragglers and stalls"),
        stat("Straggler GPUs", (f"sum(gpu_straggler{{{C}}})", "stragglers"),
             thresholds=ORANGE_ABOVE_0, w=6),
        stat("Nodes in a collective stall", (f"sum(collective_stall_active{{{C}}})", "nodes"),
             thresholds=ORANGE_ABOVE_0, w=6),
        table("Straggler findings", (f"gpu_straggler_signal{{{C}}}", ""), w=12, h=8,
              hide=("Time", "__name__", "job", "Value", "uuid"),
              description="One row for each signal behind a finding; see docs/stragglers.md."),
        ts("Stragglers by node", (f"sum by (instance) (gpu_straggler{{{N}}})", "{{instance}}"),
           bars=True),
        ts("Collective stall time by node",
           (f"rate(collective_stall_seconds_total{{{N}}}[{RI}])", "{{instance}}"),
           unit="percentunit", description="Share of time the node's GPUs were stalled."),
        row("Hardware and fabric"),
        stat("Lost GPUs", (f"count(gpu_up{{{C}}} == 0) or on() vector(0)", "lost"),
             thresholds=RED_ABOVE_0, w=6),
        stat("Critical XID codes in range",
             (f'count(gpu_xid_last_seen_timestamp_seconds{{{C}, class="critical"}} '
              f"> time() - $__range_s) or on() vector(0)", "critical"),
             thresholds=RED_ABOVE_0, w=6,
             description="GPU and code pairs with a critical XID seen in the time range."),
        stat("InfiniBand ports not active",
             (f"count(infiniband_port_state_id{{{C}}} != 4) or on() vector(0)", "ports"),
             thresholds=RED_ABOVE_0, w=6),
        stat("NVLinks down",
             (f"sum(gpu_nvlink_links_expected{{{C}}}) - sum(gpu_nvlink_links_active{{{C}}})",
              "links"), thresholds=RED_ABOVE_0, w=6),
        ts("Fabric errors by node",
           (f"sum by (instance) (rate(infiniband_port_symbol_errors_total{{{N}}}[{RI}]))",
            "{{instance}} IB symbol errors"),
           (f"sum by (instance) (rate(infiniband_port_link_downed_total{{{N}}}[{RI}]))",
            "{{instance}} IB link downed"),
           (f"sum by (instance) (rate(infiniband_port_receive_errors_total{{{N}}}[{RI}]))",
            "{{instance}} IB receive errors"),
           (f"sum by (instance) (rate(gpu_nvlink_errors_total{{{N}}}[{RI}]))",
            "{{instance}} NVLink errors"),
           unit="cps", w=24),
    ]


def node_gpu_detail() -> list[dict]:
    return [
        row("Node"),
        stat("GPUs up", (f"sum(gpu_up{{{N}}})", "up"), w=3),
        stat("GPUs expected", (f"sum(gpu_expected_devices{{{N}}})", "expected"), w=3),
        stat("Node power now", (f"sum(gpu_power_watts{{{N}}})", "power"), unit="watt", w=3),
        stat("Straggler GPUs", (f"sum(gpu_straggler{{{N}}})", "stragglers"), w=3,
             thresholds=ORANGE_ABOVE_0),
        table("GPUs", (f"gpu_info{{{G}}}", ""), w=12,
              hide=("Time", "__name__", "job", "Value", "cluster", "instance")),
        table("Jobs on this node", (f'gpu_hpc_job_info{{{G}, hpc_job=~"$hpc_job"}}', ""), w=12, h=6,
              hide=("Time", "__name__", "job", "Value", "cluster")),
        row("Utilization and power"),
        ts("GPU utilization", (f"gpu_utilization_ratio{{{G}}}", "GPU {{gpu}}"),
           unit="percentunit", minimum=0, maximum=1,
           description="Share of time a kernel ran; NCCL busy-waiting counts as busy."),
        ts("Memory utilization", (f"gpu_memory_utilization_ratio{{{G}}}", "GPU {{gpu}}"),
           unit="percentunit", minimum=0, maximum=1),
        ts("Power (instant)", (f"gpu_power_watts{{{G}}}", "GPU {{gpu}}"), unit="watt",
           description="Latest 20 Hz sample at each scrape: aliased, shows the swing's range "
                       "but not its shape. See the swing features below."),
        ts("Power (1 s average) and limit", (f"gpu_power_average_watts{{{G}}}", "GPU {{gpu}}"),
           (f"gpu_power_limit_watts{{{G}}}", "GPU {{gpu}} limit"), unit="watt"),
        ts("Average power from the energy counter",
           (f"rate(gpu_energy_joules_total{{{G}}}[{RI}])", "GPU {{gpu}}"), unit="watt",
           description="Exact average power over the interval."),
        ts("Performance state", (f"gpu_performance_state{{{G}}}", "GPU {{gpu}}"),
           description="P-state: 0 fastest, 15 slowest."),
        row("Clocks"),
        ts("SM clock", (f"gpu_sm_clock_hertz{{{G}}}", "GPU {{gpu}}"),
           (f"max(gpu_sm_clock_max_hertz{{{G}}})", "max"), unit="hertz"),
        ts("Memory clock", (f"gpu_memory_clock_hertz{{{G}}}", "GPU {{gpu}}"), unit="hertz"),
        timeline("Clock events (any selected GPU)",
                 (f"max by (reason) (gpu_clock_event_active{{{G}}})", "{{reason}}"),
                 mappings=ON_OFF),
        ts("Clock-event time by reason",
           (f"sum by (reason) (rate(gpu_clock_event_seconds_total{{{G}}}[{RI}]))", "{{reason}}"),
           (f"rate(gpu_clock_event_seconds_total{{{G}}}[{RI}]) > 0", "GPU {{gpu}} {{reason}}"),
           description="GPUs held down by each reason on average over the interval (sum), "
                       "and each GPU's share of time where above zero."),
        row("Temperature and memory"),
        ts("GPU temperature", (f"gpu_temperature_celsius{{{G}}}", "GPU {{gpu}}"),
           unit="celsius"),
        ts("HBM temperature", (f"gpu_memory_temperature_celsius{{{G}}}", "GPU {{gpu}}"),
           unit="celsius"),
        ts("Memory used", (f"gpu_memory_used_bytes{{{G}}}", "GPU {{gpu}}"), unit="bytes"),
        bargauge("Memory used share",
                 (f"gpu_memory_used_bytes{{{G}}} / gpu_memory_total_bytes{{{G}}}",
                  "GPU {{gpu}}"), unit="percentunit", minimum=0, maximum=1),
        row("PCIe"),
        ts("PCIe throughput",
           (f"rate(gpu_pcie_transmit_bytes_total{{{G}}}[{RI}])", "GPU {{gpu}} tx"),
           (f"rate(gpu_pcie_receive_bytes_total{{{G}}}[{RI}])", "GPU {{gpu}} rx"),
           unit="Bps"),
        ts("PCIe replays per minute",
           (f"rate(gpu_pcie_replays_total{{{G}}}[{RI}]) * 60", "GPU {{gpu}}"),
           thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 8}],
           description="DCGM warns above 8 per minute."),
        table("PCIe link (current vs max)",
              (f"gpu_pcie_link_generation{{{G}}}", ""),
              (f"gpu_pcie_link_max_generation{{{G}}}", ""),
              (f"gpu_pcie_link_width{{{G}}}", ""), (f"gpu_pcie_link_max_width{{{G}}}", ""),
              merge=True, w=24, h=7,
              hide=("Time", "__name__", "job", "cluster", "instance"),
              description="Value #A generation, #B max generation, #C width, #D max width. "
                          "Below max under load means a degraded link."),
        row("NVLink"),
        bargauge("NVLinks active", (f"gpu_nvlink_links_active{{{G}}}", "GPU {{gpu}}"),
                 maximum=18, h=8),
        timeline("NVLink state per link", (f"gpu_nvlink_link_up{{{G}}}",
                                           "GPU {{gpu}} link {{link}}"), mappings=UP_DOWN,
                 h=8),
        ts("NVLink throughput per link",
           (f"rate(gpu_nvlink_transmit_bytes_total{{{G}}}[{RI}])", "GPU {{gpu}} link {{link}} tx"),
           (f"rate(gpu_nvlink_receive_bytes_total{{{G}}}[{RI}])", "GPU {{gpu}} link {{link}} rx"),
           unit="Bps"),
        ts("NVLink errors per link",
           (f"rate(gpu_nvlink_errors_total{{{G}}}[{RI}])", "GPU {{gpu}} link {{link}} {{type}}"),
           unit="cps"),
        row("Power swings and stragglers (node)"),
        ts("Node power: window mean and swing amplitude",
           (f"power_swing_mean_watts{{{N}}}", "mean"),
           (f"power_swing_amplitude_watts{{{N}}}", "amplitude (p95 - p5)"), unit="watt"),
        ts("Swing frequency and observable band",
           (f"power_swing_frequency_hertz{{{N}}}", "dominant frequency"),
           (f"power_observable_band_max_hertz{{{N}}}", "observable up to"), unit="hertz"),
        ts("Largest ramp", (f"power_swing_max_ramp_watts_per_second{{{N}}}", "node"),
           (f"gpu_power_swing_max_ramp_watts_per_second{{{G}}}", "GPU {{gpu}}"), unit="watt",
           description="W/s after light smoothing."),
        ts("Swing shape", (f"power_swing_synchrony_ratio{{{N}}}", "synchrony"),
           (f"power_swing_band_energy_ratio{{{N}}}", "band energy"),
           (f"power_swing_duty_cycle_ratio{{{N}}}", "duty cycle"),
           (f"power_swing_peak_concentration_ratio{{{N}}}", "peak concentration"),
           (f"power_swing_amplitude_ratio{{{N}}}", "amplitude / TDP"),
           unit="percentunit", minimum=0, maximum=1),
        timeline("Swinging in step, collective stall",
                 (f"power_swing_active{{{N}}}", "swinging in step"),
                 (f"collective_stall_active{{{N}}}", "collective stall"),
                 (f"power_cycle_detected{{{N}}}", "slow cycle (checkpoints)"),
                 mappings=ON_OFF),
        ts("Per-GPU swing amplitude", (f"gpu_power_swing_amplitude_watts{{{G}}}", "GPU {{gpu}}"),
           unit="watt"),
        ts("Straggler scores", (f"gpu_straggler_score{{{G}}}", "GPU {{gpu}} {{signal}}"),
           thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 3.5}],
           description="Modified z-score against the peers; |M| > 3.5 with a 10 % effect "
                       "held for the persistence makes a finding."),
        ts("Stall culprit / waiting",
           (f"gpu_collective_stall_culprit{{{G}}}", "GPU {{gpu}} culprit"),
           (f"gpu_collective_stall_waiting{{{G}}}", "GPU {{gpu}} waiting"), bars=True),
    ]


def power_swings() -> list[dict]:
    # The info series is the "many" side: a GPU shared by two jobs has two of them, and
    # each job gets the GPU's energy (group_left on the counter side would be many-to-many).
    job_info = f'gpu_hpc_job_info{{{C}, hpc_job=~"$hpc_job"}}'
    job_energy = (f"sum by (hpc_job) ({job_info} * {JOIN} "
                  f"increase(gpu_energy_joules_total{{{C}}}[$__range]))")
    job_power = (f"sum by (hpc_job) ({job_info} * {JOIN} "
                 f"rate(gpu_energy_joules_total{{{C}}}[{RI}]))")
    phase_now = (f"(power_swing_phase_radians{{{N}}} + 2 * pi() * "
                 f"power_swing_frequency_hertz{{{N}}} * (time() - "
                 f"power_swing_phase_reference_timestamp_seconds{{{N}}})) % (2 * pi())")
    return [
        row("Cluster"),
        ts("Cluster power", ('cluster:gpu_power_watts:sum{cluster=~"$cluster"}', "{{cluster}}"),
           unit="watt"),
        ts("Cluster swing: coherent estimate vs sum",
           ('cluster:power_swing_coherent_amplitude_watts:estimate{cluster=~"$cluster"}',
            "{{cluster}} coherent estimate"),
           ('cluster:power_swing_amplitude_watts:sum{cluster=~"$cluster"}',
            "{{cluster}} sum of node amplitudes"), unit="watt"),
        ts("Cluster phase coherence",
           ('cluster:power_swing_phase_coherence:ratio{cluster=~"$cluster"}', "{{cluster}}"),
           unit="percentunit", minimum=0, maximum=1,
           description="1: every node swings in phase (amplitudes add); near 0: they cancel."),
        ts("Cluster ramp rate",
           ('cluster:power_ramp_watts_per_second:sum{cluster=~"$cluster"}', "{{cluster}}"),
           unit="watt", description="W/s."),
        row("Jobs"),
        ts("Power by job", ('hpc_job:gpu_power_watts:sum{hpc_job=~"$hpc_job"}', "{{hpc_job}}"),
           unit="watt"),
        ts("Swing by job: coherent estimate vs sum",
           ('hpc_job:power_swing_coherent_amplitude_watts:estimate{hpc_job=~"$hpc_job"}',
            "{{hpc_job}} coherent estimate"),
           ('hpc_job:power_swing_amplitude_watts:sum{hpc_job=~"$hpc_job"}',
            "{{hpc_job}} sum"), unit="watt"),
        ts("Phase coherence by job",
           ('hpc_job:power_swing_phase_coherence:ratio{hpc_job=~"$hpc_job"}', "{{hpc_job}}"),
           unit="percentunit", minimum=0, maximum=1),
        ts("Ramp rate by job",
           ('hpc_job:power_ramp_watts_per_second:sum{hpc_job=~"$hpc_job"}', "{{hpc_job}}"),
           unit="watt", description="W/s."),
        bargauge("Energy per job (time range)", (job_energy, "{{hpc_job}}"), unit="joule",
                 description="increase() of `gpu_energy_joules_total` joined to "
                             "`gpu_hpc_job_info`; a shared GPU's energy counts once for "
                             "each job on it."),
        ts("Average power by job (energy counter)", (job_power, "{{hpc_job}}"), unit="watt",
           description="Exact average power from the energy counter, per job."),
        row("Nodes"),
        ts("Node power", (f"sum by (instance) (gpu_power_watts{{{N}}})", "{{instance}}"),
           unit="watt"),
        ts("Node swing amplitude", (f"power_swing_amplitude_watts{{{N}}}", "{{instance}}"),
           unit="watt", description="p95 - p5 of the node's summed power over 30 s."),
        ts("Node swing amplitude / TDP", (f"power_swing_amplitude_ratio{{{N}}}", "{{instance}}"),
           unit="percentunit", minimum=0,
           thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 0.2}]),
        ts("Node swing frequency", (f"power_swing_frequency_hertz{{{N}}}", "{{instance}}"),
           unit="hertz", description="Dominant frequency: 1 / training step time."),
        ts("Node ramp rate", (f"power_swing_max_ramp_watts_per_second{{{N}}}", "{{instance}}"),
           unit="watt", description="W/s, largest over the window."),
        ts("Node phase, projected to now", (phase_now, "{{instance}}"), unit="radian",
           minimum=0, maximum=6.2832,
           description="Nodes on one line swing in phase: their swings add on the feeder."),
        ts("GPU synchrony within the node", (f"power_swing_synchrony_ratio{{{N}}}",
                                              "{{instance}}"),
           unit="percentunit", minimum=0, maximum=1),
        timeline("Swinging in step", (f"power_swing_active{{{N}}}", "{{instance}}"),
                 mappings=ON_OFF),
        ts("Large ramps (job start, stop, crash)",
           (f"sum by (instance, direction) (increase(power_ramps_total{{{N}}}[{RI}]))",
            "{{instance}} {{direction}}"), bars=True),
        ts("Slow cycles (checkpoints)", (f"power_cycle_detected{{{N}}}", "{{instance}} detected"),
           (f"power_cycle_period_seconds{{{N}}}", "{{instance}} period (s)")),
    ]


def hardware_health() -> list[dict]:
    xid_new = (f"sum by (class) (increase(gpu_xid_errors_total{{{G}}}[{RI}]) or "
               f"(gpu_xid_errors_total{{{G}}} unless gpu_xid_errors_total{{{G}}} offset {RI}))")
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
        row("XIDs"),
        ts("XIDs by class", (xid_new, "{{class}}"), bars=True, stack=True,
           description="New XID events per interval; an XID's first event counts too."),
        table("XIDs (since driver load)",
              (f"gpu_xid_errors_total{{{G}}}", ""),
              (f"gpu_xid_last_seen_timestamp_seconds{{{G}}} * 1000", ""), merge=True,
              hide=("Time", "__name__", "job", "uuid"),
              description="Value #A: count; Value #B: last seen (ms since epoch)."),
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
        row("Interconnect"),
        ts("NVLink errors", (f"sum by (instance, gpu, type) (rate(gpu_nvlink_errors_total{{{G}}}"
                             f"[{RI}])) > 0", "{{instance}} GPU {{gpu}} {{type}}"), unit="cps",
           description="Only links with errors in the interval are shown."),
        ts("NVLinks down", (f"sum by (instance) (gpu_nvlink_links_expected{{{G}}} - "
                            f"gpu_nvlink_links_active{{{G}}})", "{{instance}}"),
           thresholds=RED_ABOVE_0),
        ts("PCIe replays per minute", (f"sum by (instance, gpu) (rate(gpu_pcie_replays_total"
                                       f"{{{G}}}[{RI}])) * 60", "{{instance}} GPU {{gpu}}"),
           description="DCGM warns above 8 per minute."),
        ts("Throttling GPUs by reason",
           (f"sum by (reason) (gpu_clock_event_active{{{G}, reason=~\"sw_power_cap|hw_slowdown|"
            f"sw_thermal_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown\"}})",
            "{{reason}}"), stack=True,
           description="GPUs with each throttle reason active (idle and sync boost left out)."),
    ]


def fabric() -> list[dict]:
    p = f'{N}, device=~"$device"'
    label = "{{instance}} {{device}}/{{port}}"

    def rate(metric: str) -> str:
        return f"rate({metric}{{{p}}}[{RI}])"

    device_var = query_var("device", "HCA", f"label_values(infiniband_port_info{{{N}}}, device)")
    return [
        row("Throughput"),
        ts("Transmit per port", (rate("infiniband_port_transmit_bytes_total"), label),
           unit="Bps"),
        ts("Receive per port", (rate("infiniband_port_receive_bytes_total"), label),
           unit="Bps"),
        ts("Transmit as share of port rate",
           (f"{rate('infiniband_port_transmit_bytes_total')} / "
            f"infiniband_port_rate_bytes_per_second{{{p}}}", label),
           unit="percentunit", minimum=0),
        ts("Packets per port", (rate("infiniband_port_transmit_packets_total"), f"{label} tx"),
           (rate("infiniband_port_receive_packets_total"), f"{label} rx"), unit="pps"),
        row("Link state"),
        table("Ports", (f"infiniband_port_info{{{p}}}", ""),
              (f"infiniband_port_rate_bytes_per_second{{{p}}} * 8", ""), merge=True,
              hide=("Time", "__name__", "job", "Value #A"), w=24, h=7,
              description="Value #B: negotiated rate in bit/s."),
        timeline("Logical port state", (f"infiniband_port_state_id{{{p}}}", label),
                 mappings=PORT_STATE),
        timeline("Physical port state", (f"infiniband_port_physical_state_id{{{p}}}", label),
                 mappings=PHYS_STATE),
        row("Errors"),
        ts("Link errors", (rate("infiniband_port_symbol_errors_total"), f"{label} symbol"),
           (rate("infiniband_port_link_error_recovery_total"), f"{label} error recovery"),
           (rate("infiniband_port_link_downed_total"), f"{label} link downed"),
           (rate("infiniband_port_local_link_integrity_errors_total"),
            f"{label} local link integrity"), unit="cps"),
        ts("Receive errors and discards",
           (rate("infiniband_port_receive_errors_total"), f"{label} rcv errors"),
           (rate("infiniband_port_receive_discards_total"), f"{label} rcv discards"),
           (rate("infiniband_port_transmit_discards_total"), f"{label} xmit discards"),
           (rate("infiniband_port_receive_remote_physical_errors_total"),
            f"{label} remote physical"), unit="cps"),
        ts("Congestion: transmit wait", (rate("infiniband_port_transmit_wait_total"), label),
           description="Ticks per second the port had data but could not send."),
        ts("RoCE congestion control: CNP and ECN",
           (rate("infiniband_port_cnp_sent_total"), f"{label} CNP sent"),
           (rate("infiniband_port_cnp_handled_total"), f"{label} CNP handled"),
           (rate("infiniband_port_ecn_marked_packets_total"), f"{label} ECN marked"), unit="pps"),
        ts("RoCE loss and retransmission",
           (rate("infiniband_port_local_ack_timeout_errors_total"), f"{label} ack timeout"),
           (rate("infiniband_port_out_of_sequence_packets_total"), f"{label} out of sequence"),
           (rate("infiniband_port_packet_sequence_errors_total"), f"{label} seq NAK"),
           (rate("infiniband_port_rnr_nak_retry_errors_total"), f"{label} RNR NAK retry"),
           (rate("infiniband_port_out_of_buffer_drops_total"), f"{label} out of buffer"),
           unit="cps"),
        table("Link downed (since counters reset)",
              (f"infiniband_port_link_downed_total{{{p}}}", ""),
              hide=("Time", "__name__", "job")),
        row("Host network"),
        ts("Host network throughput",
           (f"rate(host_network_transmit_bytes_total{{{N}}}[{RI}])",
            "{{instance}} {{interface}} tx"),
           (f"rate(host_network_receive_bytes_total{{{N}}}[{RI}])",
            "{{instance}} {{interface}} rx"), unit="Bps"),
        ts("Host network errors and drops",
           (f"rate(host_network_receive_errors_total{{{N}}}[{RI}])",
            "{{instance}} {{interface}} rx errors"),
           (f"rate(host_network_transmit_errors_total{{{N}}}[{RI}])",
            "{{instance}} {{interface}} tx errors"),
           (f"rate(host_network_receive_drops_total{{{N}}}[{RI}])",
            "{{instance}} {{interface}} rx drops"),
           (f"rate(host_network_transmit_drops_total{{{N}}}[{RI}])",
            "{{instance}} {{interface}} tx drops"), unit="cps"),
        row("NVLink (scale-up fabric)"),
        ts("NVLink throughput per GPU",
           (f"sum by (instance, gpu) (rate(gpu_nvlink_transmit_bytes_total{{{G}}}[{RI}]))",
            "{{instance}} GPU {{gpu}} tx"),
           (f"sum by (instance, gpu) (rate(gpu_nvlink_receive_bytes_total{{{G}}}[{RI}]))",
            "{{instance}} GPU {{gpu}} rx"), unit="Bps"),
        ts("NVLink links active vs expected",
           (f"sum by (instance) (gpu_nvlink_links_active{{{G}}})", "{{instance}} active"),
           (f"sum by (instance) (gpu_nvlink_links_expected{{{G}}})", "{{instance}} expected")),
    ], device_var


# --- assembly -------------------------------------------------------------------------

def layout(panels: list[dict]) -> list[dict]:
    """Flow panels left to right in 24 columns; a row starts a new line."""
    x = y = line_h = 0
    for pid, p in enumerate(panels, start=1):
        w, h = p.pop("_size")
        if p["type"] == "row" or x + w > 24:
            x, y, line_h = 0, y + line_h, 0
        p["id"] = pid
        p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        x += w
        line_h = max(line_h, h)
        if p["type"] == "row":
            x, y, line_h = 0, y + h, 0
    return panels


def dashboard(uid: str, title: str, description: str, panels: list[dict],
              templating: list[dict]) -> dict:
    return {
        "uid": uid, "title": title, "description": description,
        "tags": ["cluster-telemetry-exporter", "gpu"], "editable": True,
        "graphTooltip": 1, "schemaVersion": 39, "version": 1, "timezone": "",
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "liveNow": False,
        "fiscalYearStartMonth": 0, "weekStart": "",
        "timepicker": {}, "annotations": {"list": []},
        "links": [{"type": "dashboards", "title": "GPU cluster", "tags":
                   ["cluster-telemetry-exporter"], "asDropdown": True, "includeVars": True,
                   "keepTime": True, "icon": "external link", "targetBlank": False,
                   "tooltip": "", "url": ""}],
        "templating": {"list": templating},
        "panels": layout(panels),
    }


def build() -> dict[str, dict]:
    fabric_panels, device_var = fabric()
    return {
        "cluster-overview.json": dashboard(
            "cte-cluster-overview", "GPU cluster overview",
            "GPUs up vs expected, firing alerts, power and coherent swings, stragglers and "
            "fabric errors across the cluster.", cluster_overview(), variables()),
        "node-gpu-detail.json": dashboard(
            "cte-node-gpu-detail", "GPU node and GPU detail",
            "One node: per-GPU utilization, power, clocks, temperatures, memory, PCIe, "
            "NVLink per link and the node's swing and straggler features.",
            node_gpu_detail(), variables(single_instance=True)),
        "power-swings.json": dashboard(
            "cte-power-swings", "GPU power and swings",
            "Cluster, job and node power; swing amplitude, frequency, ramp rate, phase "
            "coherence; energy per job.", power_swings(), variables()),
        "hardware-health.json": dashboard(
            "cte-hardware-health", "GPU hardware health",
            "Lost GPUs, XIDs by class, ECC, row remapping, retired pages, NVLink and PCIe "
            "errors, throttling.", hardware_health(), variables()),
        "fabric.json": dashboard(
            "cte-fabric", "GPU cluster fabric",
            "InfiniBand/RoCE throughput, errors and link state per port; host network; "
            "NVLink.", fabric_panels, variables(extra=[device_var])),
    }


def render(board: dict) -> str:
    return json.dumps(board, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, board in build().items():
        (OUT / name).write_text(render(board))
        print(f"wrote dashboards/{name}: {len(board['panels'])} panels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
