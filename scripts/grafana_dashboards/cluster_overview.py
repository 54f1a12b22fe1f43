"""GPU cluster overview: fleet health, power and swings, stragglers, hardware and fabric."""

from __future__ import annotations

from .common import (
    NO_ALERTS,
    ORANGE_ABOVE_0,
    RED_ABOVE_0,
    RI,
    C,
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

FILE = "cluster-overview.json"


def fleet() -> list[Item]:
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
    ]


def power() -> list[Item]:
    return [
        row("Power"),
        stat("GPU power now", (f"sum(gpu_power_watts{{{C}}})", "power"), unit="watt", w=6,
             description="Sum of the GPUs' instant power (board power, not wall power)."),
        stat("Coherent swing now",
             ('sum(cluster:power_swing_coherent_amplitude_watts:estimate{cluster=~"$cluster"})',
              "coherent swing"), unit="watt", w=6,
             description="Peak-to-peak swing the grid sees when nodes swing in phase "
                         "(`cluster:power_swing_coherent_amplitude_watts:estimate`)."),
        stat("Nodes swinging in step", (f"sum(gpu_node_power_swing_active{{{C}}})", "nodes"), w=6,
             thresholds=ORANGE_ABOVE_0,
             description="Nodes whose GPUs swing together at >= 20 % of TDP in 0.1-3 Hz."),
        bargauge("Swing amplitude by node (top 10)",
                 (f"topk(10, gpu_node_power_swing_amplitude_watts{{{N}}})", "{{instance}}"),
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
    ]


def compute_or_wait() -> list[Item]:
    compute = "instance_gpu:gpu_compute_active_ratio:max"
    wait = "instance_gpu:gpu_wait_active_ratio:clamp"
    return [
        row("Compute or wait (GPM)"),
        stat("Compute share now", (f"avg({compute}{{{C}}})", "computing"),
             unit="percentunit", w=6,
             description="Mean over the GPUs of the busiest math pipe's share of the time "
                         "(tensor, FP64, FP32, FP16; profiling metrics from GPM)."),
        stat("Waiting share now", (f"avg({wait}{{{C}}})", "waiting"), unit="percentunit",
             w=6, description="A kernel resident but no math pipe busy: spinning in "
                              "collectives, copies. `gpu_utilization_ratio` counts it busy."),
        stat("GPUs without GPM", (f"count(gpu_profiling_supported{{{C}}} == 0) or on() "
                                  "vector(0)", "GPUs"), w=6,
             description="GPUs that give no profiling metrics (before Hopper, MIG without "
                         "permission): left out of the shares here."),
        stat("Utilization now (any kernel)", (f"avg(gpu_utilization_ratio{{{C}}})", "busy"),
             unit="percentunit", w=6,
             description="NVML's utilization for comparison: waiting counts as busy."),
        ts("Compute vs wait (selected clusters)",
           (f"avg({compute}{{{C}}})", "computing"),
           (f"avg({wait}{{{C}}})", "waiting (kernel resident, no math)"),
           (f"1 - avg(gpu_graphics_engine_active_ratio{{{C}}})", "idle (no kernel)"),
           unit="percentunit", stack=True, minimum=0, maximum=1,
           description="Share of GPU time computing, waiting and idle, averaged over the "
                       "GPUs with GPM (recording rules in alerts/profiling.yml)."),
        ts("Compute share by job",
           ('hpc_job:gpu_compute_active_ratio:avg{hpc_job=~"$hpc_job"}', "{{hpc_job}} computing"),
           ('hpc_job:gpu_wait_active_ratio:avg{hpc_job=~"$hpc_job"}', "{{hpc_job}} waiting"),
           unit="percentunit", minimum=0, maximum=1,
           description="Recording rules `hpc_job:gpu_compute_active_ratio:avg` and "
                       "`hpc_job:gpu_wait_active_ratio:avg`."),
        ts("Energy per compute-second by job",
           ('hpc_job:gpu_energy_joules_per_compute_second:ratio{hpc_job=~"$hpc_job"}',
            "{{hpc_job}}"), unit="joule",
           description="Joules the job's GPUs draw per second of full-GPU compute: power "
                       "over the sum of compute shares. Waiting raises it."),
        ts("Compute share by cluster",
           ('cluster:gpu_compute_active_ratio:avg{cluster=~"$cluster"}', "{{cluster}} computing"),
           ('cluster:gpu_wait_active_ratio:avg{cluster=~"$cluster"}', "{{cluster}} waiting"),
           unit="percentunit", minimum=0, maximum=1),
    ]


def goodput() -> list[Item]:
    held = ("Productive over held time over the last hour, read from the GPUs alone "
            "(docs/goodput.md): held is every state but unallocated and unknown.")
    return [
        row("Goodput: where the GPU-hours go"),
        stat("Cluster goodput (last hour)",
             ('avg(cluster:gpu_goodput:ratio{cluster=~"$cluster"})', "goodput"),
             unit="percentunit", w=6, description=f"`cluster:gpu_goodput:ratio`. {held}"),
        stat("Energy per productive GPU-hour",
             ('avg(cluster:gpu_energy_per_productive_gpu_hour:joules{cluster=~"$cluster"})',
              "energy"), unit="joule", w=6,
             description="All the GPUs' energy over the productive GPU-hours, last hour "
                         "(`cluster:gpu_energy_per_productive_gpu_hour:joules`)."),
        bargauge("Goodput by pod (lowest 10)",
                 (f"bottomk(10, namespace_pod:gpu_goodput:ratio{{{C}}})", "{{namespace}}/{{pod}}"),
                 unit="percentunit", minimum=0, maximum=1, w=12, h=4,
                 description=f"`namespace_pod:gpu_goodput:ratio`. {held}"),
        ts("Goodput by job",
           ('hpc_job:gpu_goodput:ratio{hpc_job=~"$hpc_job"}', "{{hpc_job}}"),
           unit="percentunit", minimum=0, maximum=1,
           description=f"`hpc_job:gpu_goodput:ratio`. {held}"),
        ts("Badput by state (selected clusters)",
           ('sum by (state) (cluster_state:gpu_badput:ratio{cluster=~"$cluster"})', "{{state}}"),
           unit="percentunit", stack=True, minimum=0,
           description="Each held state other than productive, as a share of the held time "
                       "(`cluster_state:gpu_badput:ratio`): checkpoint, stalled, starting, "
                       "idle, failed."),
        ts("Badput by state and job",
           ('hpc_job_state:gpu_badput:ratio{hpc_job=~"$hpc_job"}', "{{hpc_job}} {{state}}"),
           unit="percentunit", stack=True, minimum=0,
           description="`hpc_job_state:gpu_badput:ratio`: what JobGoodputLow names."),
        ts("Energy per productive GPU-hour by job",
           ('hpc_job:gpu_energy_per_productive_gpu_hour:joules{hpc_job=~"$hpc_job"}',
            "{{hpc_job}}"), unit="joule",
           description="The job's GPU energy over its productive GPU-hours, last hour: "
                       "badput raises it."),
    ]


def tenants() -> list[Item]:
    split = ("A GPU held by several containers or jobs (time-slicing, MIG instances) is "
             "split equally among them: power is measured per GPU.")
    return [
        row("Who uses the GPUs: pods, namespaces, jobs"),
        ts("GPU power by namespace",
           (f"namespace:gpu_power_watts:avg5m{{{C}}}", "{{namespace}}"), unit="watt",
           stack=True, description="5-minute average of the GPUs' sampled energy, by the "
           f"namespace of the pods holding them (`namespace:gpu_power_watts:avg5m`). {split}"),
        bargauge("Share of GPU energy by namespace",
                 (f"namespace:gpu_power:share{{{C}}}", "{{namespace}}"), unit="percentunit",
                 minimum=0, maximum=1,
                 description="Of the cluster's GPU energy (`namespace:gpu_power:share`); the "
                             "rest is GPUs no pod holds."),
        ts("Busy GPUs by namespace",
           (f"namespace:gpu_utilization_ratio:sum{{{C}}}", "{{namespace}}"), stack=True,
           description="GPU utilization summed over the GPUs a namespace's pods hold: busy "
                       f"GPU-equivalents. GPUs in MIG mode report no utilization. {split}"),
        bargauge("Share of busy GPUs by namespace",
                 (f"namespace:gpu_utilization:share{{{C}}}", "{{namespace}}"),
                 unit="percentunit", minimum=0, maximum=1),
        table("Top pods by GPU power",
              (f"topk(20, namespace_pod:gpu_power_watts:avg5m{{{C}}})", ""),
              (f"namespace_pod:gpus_held:sum{{{C}}}", ""), merge=True, unit="watt",
              hide=("Time", "__name__", "job", "cluster"),
              description="Value #A power (W), #B GPUs held (a shared GPU counts a share)."),
        ts("GPU power by job (shared GPUs split)",
           (f'hpc_job:gpu_power_watts:avg5m{{{C}, hpc_job=~"$hpc_job"}}', "{{hpc_job}}"),
           unit="watt", description=f"`hpc_job:gpu_power_watts:avg5m`. {split}"),
        bargauge("Share of GPU energy by job",
                 (f'hpc_job:gpu_power:share{{{C}, hpc_job=~"$hpc_job"}}', "{{hpc_job}}"),
                 unit="percentunit", minimum=0, maximum=1),
        bargauge("Share of busy GPUs by job",
                 (f'hpc_job:gpu_utilization:share{{{C}, hpc_job=~"$hpc_job"}}', "{{hpc_job}}"),
                 unit="percentunit", minimum=0, maximum=1),
    ]


def stragglers() -> list[Item]:
    return [
        row("Stragglers and stalls"),
        stat("Straggler GPUs", (f"sum(gpu_straggler{{{C}}})", "stragglers"),
             thresholds=ORANGE_ABOVE_0, w=6),
        stat("Nodes in a collective stall",
             (f"sum(gpu_node_collective_stall_active{{{C}}})", "nodes"),
             thresholds=ORANGE_ABOVE_0, w=6),
        table("Straggler findings", (f"gpu_straggler_signal{{{C}}}", ""), w=12, h=8,
              hide=("Time", "__name__", "job", "Value", "uuid"),
              description="One row for each signal behind a finding; see docs/stragglers.md."),
        ts("Stragglers by node", (f"sum by (instance) (gpu_straggler{{{N}}})", "{{instance}}"),
           bars=True),
        ts("Collective stall time by node",
           (f"rate(gpu_node_collective_stall_seconds_total{{{N}}}[{RI}])", "{{instance}}"),
           unit="percentunit", description="Share of time the node's GPUs were stalled."),
    ]


def hardware_and_fabric() -> list[Item]:
    def by_node(metric: str) -> str:
        return f"sum by (instance) (rate({metric}{{{N}}}[{RI}]))"

    return [
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
           (by_node("infiniband_port_symbol_errors_total"), "{{instance}} IB symbol errors"),
           (by_node("infiniband_port_link_downed_total"), "{{instance}} IB link downed"),
           (by_node("infiniband_port_receive_errors_total"), "{{instance}} IB receive errors"),
           (by_node("gpu_nvlink_errors_total"), "{{instance}} NVLink errors"),
           unit="cps", w=24),
    ]


def board():
    return dashboard(
        "cte-cluster-overview", "GPU cluster overview",
        "GPUs up vs expected, firing alerts, power and coherent swings, compute vs wait, "
        "goodput and badput by state, who uses the GPUs (pods, namespaces, jobs), "
        "stragglers and fabric errors across the cluster.",
        [*fleet(), *power(), *compute_or_wait(), *goodput(), *tenants(), *stragglers(),
         *hardware_and_fabric()],
        variables())
