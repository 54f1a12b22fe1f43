"""GPU power and swings: cluster, job and node power, swing features, energy per job."""

from __future__ import annotations

from .common import (
    JOIN,
    ON_OFF,
    RI,
    C,
    Item,
    N,
    bargauge,
    dashboard,
    row,
    steps,
    timeline,
    ts,
    variables,
)

FILE = "power-swings.json"


def cluster() -> list[Item]:
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
    ]


def jobs() -> list[Item]:
    # The info series is the "many" side: a GPU shared by two jobs has two of them, and
    # each job gets the GPU's energy (group_left on the counter side would be many-to-many).
    job_info = f'gpu_hpc_job_info{{{C}, hpc_job=~"$hpc_job"}}'
    job_energy = (f"sum by (hpc_job) ({job_info} * {JOIN} "
                  f"increase(gpu_energy_joules_total{{{C}}}[$__range]))")
    job_power = (f"sum by (hpc_job) ({job_info} * {JOIN} "
                 f"rate(gpu_energy_joules_total{{{C}}}[{RI}]))")
    return [
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
        ts("Step period by job (from power)",
           ('hpc_job:power_swing_step_period_seconds:max{hpc_job=~"$hpc_job"}', "{{hpc_job}}"),
           unit="s", minimum=0,
           description="The job's step rhythm read from its nodes' power: the slowest "
                       "node's step swing inside its compute plateaus (with gradient "
                       "accumulation, the micro-step). A straggler slows the whole job: the "
                       "period rises on every node of it at once."),
        ts("Ramp rate by job",
           ('hpc_job:power_ramp_watts_per_second:sum{hpc_job=~"$hpc_job"}', "{{hpc_job}}"),
           unit="watt", description="W/s."),
        bargauge("Energy per job (time range)", (job_energy, "{{hpc_job}}"), unit="joule",
                 description="increase() of `gpu_energy_joules_total` joined to "
                             "`gpu_hpc_job_info`; a shared GPU's energy counts once for "
                             "each job on it."),
        ts("Average power by job (energy counter)", (job_power, "{{hpc_job}}"), unit="watt",
           description="Exact average power from the energy counter, per job."),
    ]


def nodes() -> list[Item]:
    phase_now = (f"(gpu_node_power_swing_phase_radians{{{N}}} + 2 * pi() * "
                 f"gpu_node_power_swing_frequency_hertz{{{N}}} * (time() - "
                 f"gpu_node_power_swing_phase_reference_timestamp_seconds{{{N}}})) % (2 * pi())")
    return [
        row("Nodes"),
        ts("Node power", (f"sum by (instance) (gpu_power_watts{{{N}}})", "{{instance}}"),
           unit="watt"),
        ts("Node swing amplitude", (f"gpu_node_power_swing_amplitude_watts{{{N}}}", "{{instance}}"),
           unit="watt", description="p95 - p5 of the node's summed power over 30 s."),
        ts("Node swing amplitude / TDP",
           (f"gpu_node_power_swing_amplitude_ratio{{{N}}}", "{{instance}}"),
           unit="percentunit", minimum=0, thresholds=steps((0.2, "orange"))),
        ts("Node swing frequency", (f"gpu_node_power_swing_frequency_hertz{{{N}}}", "{{instance}}"),
           unit="hertz", description="Dominant frequency: 1 / training step time."),
        ts("Node step period (compute plateaus)",
           (f"gpu_node_power_swing_step_period_seconds{{{N}}}", "{{instance}}"), unit="s",
           minimum=0,
           description="1 / the frequency of the clear, coherent step swing inside the "
                       "node's compute plateaus (pauses left out), whatever its amplitude; "
                       "absent while none is clear."),
        ts("Node ramp rate",
           (f"gpu_node_power_swing_max_ramp_watts_per_second{{{N}}}", "{{instance}}"),
           unit="watt", description="W/s, largest over the window."),
        ts("Node phase, projected to now", (phase_now, "{{instance}}"), unit="radian",
           minimum=0, maximum=6.2832,
           description="Nodes on one line swing in phase: their swings add on the feeder."),
        ts("GPU synchrony within the node", (f"gpu_node_power_swing_synchrony_ratio{{{N}}}",
                                              "{{instance}}"),
           unit="percentunit", minimum=0, maximum=1),
        timeline("Swinging in step", (f"gpu_node_power_swing_active{{{N}}}", "{{instance}}"),
                 mappings=ON_OFF),
        ts("Large ramps (job start, stop, crash)",
           (f"sum by (instance, direction) (increase(gpu_node_power_ramps_total{{{N}}}[{RI}]))",
            "{{instance}} {{direction}}"), bars=True),
        ts("Slow cycles (checkpoints)",
           (f"gpu_node_power_cycle_detected{{{N}}}", "{{instance}} detected"),
           (f"gpu_node_power_cycle_period_seconds{{{N}}}", "{{instance}} period (s)")),
    ]


def board():
    return dashboard(
        "cte-power-swings", "GPU power and swings",
        "Cluster, job and node power; swing amplitude, frequency, ramp rate, phase "
        "coherence; energy per job.", [*cluster(), *jobs(), *nodes()], variables())
