"""GPU node and GPU detail: one node's GPUs, clocks, memory, PCIe, NVLink and swings."""

from __future__ import annotations

from .common import (
    ON_OFF,
    ORANGE_ABOVE_0,
    PCIE_REPLAYS_LIMIT,
    RI,
    G,
    Item,
    N,
    bargauge,
    dashboard,
    row,
    stat,
    steps,
    table,
    timeline,
    ts,
    variables,
)

FILE = "node-gpu-detail.json"


def node() -> list[Item]:
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
    ]


def who_holds_the_gpus() -> list[Item]:
    hide = ("Time", "__name__", "job", "Value", "cluster", "instance")
    return [
        row("Who holds the GPUs: pods, MIG instances, processes"),
        table("Pods holding this node's GPUs", (f"gpu_pod_info{{{G}}}", ""), hide=hide,
              description="From the kubelet's pod-resources API (`gpu_pod_info`); "
                          "`gpu_instance` names a MIG instance, empty for a whole GPU."),
        table("MIG mode and instances", (f"gpu_mig_enabled{{{G}}}", ""),
              (f"gpu_mig_instance_info{{{G}}}", ""), hide=("Time", "__name__", "job",
                                                           "cluster", "instance"),
              description="A: 1 where the GPU is split into MIG instances; B: each MIG "
                          "device, its profile and GPU instance (the key gpu_pod_info and "
                          "gpu_hpc_job_info carry)."),
        ts("GPU power by process",
           (f"rate(gpu_process_energy_joules_total{{{G}}}[{RI}])", "GPU {{gpu}} {{pid}}"),
           unit="watt", stack=True,
           description="The GPU's energy split by each process's SM utilization; `idle` is "
                       "the rest (needs `--collector.processes`; none on MIG GPUs)."),
        ts("Process SM utilization",
           (f"gpu_process_sm_utilization_ratio{{{G}}}", "GPU {{gpu}} {{pid}}"),
           unit="percentunit", minimum=0, maximum=1),
        table("Processes", (f"gpu_process_memory_used_bytes{{{G}}} * on(instance, gpu, uuid, "
                            f"pid) group_left(command, container_id, gpu_instance) "
                            f"gpu_process_info{{{G}}}", ""), unit="bytes", w=24, h=6,
              hide=("Time", "__name__", "job", "cluster", "instance"),
              description="Device memory by process, with its command and container."),
    ]


def utilization_and_power() -> list[Item]:
    return [
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
    ]


def profiling() -> list[Item]:
    def avg(metric: str) -> str:
        return f"avg(gpu_{metric}_ratio{{{G}}})"

    return [
        row("Compute or wait (GPM profiling)"),
        ts("Activity breakdown (mean of the selected GPUs)",
           (avg("graphics_engine_active"), "graphics engine"), (avg("sm_active"), "SM active"),
           (avg("sm_occupancy"), "SM occupancy"), (avg("tensor_active"), "tensor pipes"),
           (avg("fp64_active"), "FP64"), (avg("fp32_active"), "FP32"),
           (avg("fp16_active"), "FP16"), (avg("dram_active"), "DRAM bandwidth"),
           unit="percentunit", minimum=0, maximum=1,
           description="GPM's counters (DCGM_FI_PROF_*), each averaged over the profiling "
                       "interval (10 s). Engine busy with idle pipes: waiting."),
        bargauge("Compute vs wait per GPU",
                 (f"instance_gpu:gpu_compute_active_ratio:max{{{G}}}", "GPU {{gpu}} computing"),
                 (f"instance_gpu:gpu_wait_active_ratio:clamp{{{G}}}", "GPU {{gpu}} waiting"),
                 unit="percentunit", minimum=0, maximum=1,
                 description="Computing: the busiest math pipe. Waiting: a kernel resident "
                             "with no math (a collective spinning for a slower peer)."),
        ts("Tensor pipes active per GPU", (f"gpu_tensor_active_ratio{{{G}}}", "GPU {{gpu}}"),
           unit="percentunit", minimum=0, maximum=1,
           description="The GPU that computes while its peers wait stands out here."),
        ts("SM active and DRAM per GPU", (f"gpu_sm_active_ratio{{{G}}}", "GPU {{gpu}} SM"),
           (f"gpu_dram_active_ratio{{{G}}}", "GPU {{gpu}} DRAM"),
           unit="percentunit", minimum=0, maximum=1),
        table("Profiling support", (f"gpu_profiling_supported{{{G}}}", ""), w=24, h=5,
              hide=("Time", "__name__", "job", "cluster", "instance"),
              description="1 where GPM gives these metrics; 0 with the reason (before "
                          "Hopper, no driver support, MIG without permission)."),
    ]


def clocks() -> list[Item]:
    return [
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
    ]


def temperature_and_memory() -> list[Item]:
    return [
        row("Temperature and memory"),
        ts("GPU temperature", (f"gpu_temperature_celsius{{{G}}}", "GPU {{gpu}}"),
           unit="celsius"),
        ts("HBM temperature", (f"gpu_memory_temperature_celsius{{{G}}}", "GPU {{gpu}}"),
           unit="celsius"),
        ts("Memory used", (f"gpu_memory_used_bytes{{{G}}}", "GPU {{gpu}}"), unit="bytes"),
        bargauge("Memory used share",
                 (f"gpu_memory_used_bytes{{{G}}} / gpu_memory_total_bytes{{{G}}}",
                  "GPU {{gpu}}"), unit="percentunit", minimum=0, maximum=1),
    ]


def pcie() -> list[Item]:
    return [
        row("PCIe"),
        ts("PCIe throughput",
           (f"rate(gpu_pcie_transmit_bytes_total{{{G}}}[{RI}])", "GPU {{gpu}} tx"),
           (f"rate(gpu_pcie_receive_bytes_total{{{G}}}[{RI}])", "GPU {{gpu}} rx"),
           unit="Bps"),
        ts("PCIe replays per minute",
           (f"rate(gpu_pcie_replays_total{{{G}}}[{RI}]) * 60", "GPU {{gpu}}"),
           description=PCIE_REPLAYS_LIMIT),
        table("PCIe link (current vs max)",
              (f"gpu_pcie_link_generation{{{G}}}", ""),
              (f"gpu_pcie_link_max_generation{{{G}}}", ""),
              (f"gpu_pcie_link_width{{{G}}}", ""), (f"gpu_pcie_link_max_width{{{G}}}", ""),
              merge=True, w=24, h=7,
              hide=("Time", "__name__", "job", "cluster", "instance"),
              description="Value #A generation, #B max generation, #C width, #D max width. "
                          "Below max under load means a degraded link."),
    ]


def nvlink() -> list[Item]:
    return [
        row("NVLink"),
        bargauge("NVLinks active", (f"gpu_nvlink_links_active{{{G}}}", "GPU {{gpu}}"),
                 maximum=18, h=8),
        timeline("NVLinks down",
                 (f"gpu_nvlink_links_expected{{{G}}} - gpu_nvlink_links_active{{{G}}}",
                  "GPU {{gpu}}"), h=8,
                 description="Links the GPU should have but are not active. Which ones: "
                             "gpu_nvlink_link_up, served by --metrics.profile full (or a "
                             "selection file that includes it)."),
        ts("NVLink throughput per GPU",
           (f"sum by (gpu) (rate(gpu_nvlink_transmit_bytes_total{{{G}}}[{RI}]))",
            "GPU {{gpu}} tx"),
           (f"sum by (gpu) (rate(gpu_nvlink_receive_bytes_total{{{G}}}[{RI}]))",
            "GPU {{gpu}} rx"),
           unit="Bps", description="Per link: --metrics.profile full."),
        ts("NVLink errors per GPU",
           (f"sum by (gpu, type) (rate(gpu_nvlink_errors_total{{{G}}}[{RI}]))",
            "GPU {{gpu}} {{type}}"),
           unit="cps", description="Per link: --metrics.profile full."),
    ]


def swings_and_stragglers() -> list[Item]:
    return [
        row("Power swings and stragglers (node)"),
        ts("Node power: window mean and swing amplitude",
           (f"gpu_node_power_swing_mean_watts{{{N}}}", "mean"),
           (f"gpu_node_power_swing_amplitude_watts{{{N}}}", "amplitude (p95 - p5)"), unit="watt"),
        ts("Swing frequency and observable band",
           (f"gpu_node_power_swing_frequency_hertz{{{N}}}", "dominant frequency"),
           (f"gpu_node_power_observable_band_max_hertz{{{N}}}", "observable up to"), unit="hertz"),
        ts("Largest ramp", (f"gpu_node_power_swing_max_ramp_watts_per_second{{{N}}}", "node"),
           (f"gpu_power_swing_max_ramp_watts_per_second{{{G}}}", "GPU {{gpu}}"), unit="watt",
           description="W/s after light smoothing."),
        ts("Swing shape", (f"gpu_node_power_swing_synchrony_ratio{{{N}}}", "synchrony"),
           (f"gpu_node_power_swing_band_energy_ratio{{{N}}}", "band energy"),
           (f"gpu_node_power_swing_duty_cycle_ratio{{{N}}}", "duty cycle"),
           (f"gpu_node_power_swing_peak_concentration_ratio{{{N}}}", "peak concentration"),
           (f"gpu_node_power_swing_amplitude_ratio{{{N}}}", "amplitude / TDP"),
           unit="percentunit", minimum=0, maximum=1),
        timeline("Swinging in step, collective stall",
                 (f"gpu_node_power_swing_active{{{N}}}", "swinging in step"),
                 (f"gpu_node_collective_stall_active{{{N}}}", "collective stall"),
                 (f"gpu_node_power_cycle_detected{{{N}}}", "slow cycle (checkpoints)"),
                 mappings=ON_OFF),
        ts("Per-GPU swing amplitude", (f"gpu_power_swing_amplitude_watts{{{G}}}", "GPU {{gpu}}"),
           unit="watt"),
        ts("Straggler scores", (f"gpu_straggler_score{{{G}}}", "GPU {{gpu}} {{signal}}"),
           thresholds=steps((3.5, "red")),
           description="Modified z-score against the peers; |M| > 3.5 with a 10 % effect "
                       "held for the persistence makes a finding."),
        ts("Stall culprit / waiting",
           (f"gpu_collective_stall_culprit{{{G}}}", "GPU {{gpu}} culprit"),
           (f"gpu_collective_stall_waiting{{{G}}}", "GPU {{gpu}} waiting"), bars=True),
    ]


def board():
    return dashboard(
        "cte-node-gpu-detail", "GPU node and GPU detail",
        "One node: who holds its GPUs (pods, MIG instances, processes), per-GPU "
        "utilization, power, compute vs wait (GPM), clocks, temperatures, memory, PCIe, "
        "NVLink per link and the node's swing and straggler features.",
        [*node(), *who_holds_the_gpus(), *utilization_and_power(), *profiling(), *clocks(),
         *temperature_and_memory(), *pcie(), *nvlink(), *swings_and_stragglers()],
        variables(single_instance=True))
