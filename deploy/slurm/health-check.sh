#!/bin/sh
# Slurm HealthCheckProgram: asks the local exporter for its verdict and drains this node
# with scontrol when the node's action needs it (a reboot, a service, or a GPU reset
# while jobs run on it). It never resumes a node. Install and configure:
# deploy/slurm/README.md. slurm.conf gives the program no arguments, so they live here.
# Settings (slurmd runs the program with none of its own environment, only
# SLURMD_NODENAME, so they come from a file of NAME=value lines, CTE_SLURM_ENV, default
# /etc/cluster-telemetry-exporter/slurm.env; a variable already set wins):
#   CTE_BIN          the exporter's command
#                    (default /opt/cluster-telemetry-exporter/bin/cluster-telemetry-exporter)
#   CTE_CONFIG       the exporter's config file, for its listen address and web config
#                    (default /etc/cluster-telemetry-exporter/config.yaml; skipped if absent)
#   CTE_HEALTH_ARGS  more flags for `health`, e.g.
#                    "--auth.username slurm --auth.password-file /etc/cte/health.password"
# Exit 0 unless a drain was needed and scontrol failed: slurmd may run this at its start
# until it exits 0, and a stopped exporter must not hold the node back.

# The settings file: only CTE_* names are read; quotes around a value go.
cte_read_settings() {
    [ -f "$1" ] && [ -r "$1" ] || return 0
    while IFS= read -r cte_line || [ -n "$cte_line" ]; do
        case $cte_line in
            CTE_*=*) ;;
            *) continue ;;
        esac
        cte_name=${cte_line%%=*}
        case $cte_name in *[!A-Z_]*) continue ;; esac
        eval "cte_set=\${$cte_name+set}"
        [ -z "$cte_set" ] || continue
        cte_value=${cte_line#*=}
        case $cte_value in
            \"*\") cte_value=${cte_value#\"}; cte_value=${cte_value%\"} ;;
            \'*\') cte_value=${cte_value#\'}; cte_value=${cte_value%\'} ;;
        esac
        eval "$cte_name=\$cte_value"
    done < "$1"
}
cte_read_settings "${CTE_SLURM_ENV:-/etc/cluster-telemetry-exporter/slurm.env}"

PATH=${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CTE_BIN=${CTE_BIN:-/opt/cluster-telemetry-exporter/bin/cluster-telemetry-exporter}
CTE_CONFIG=${CTE_CONFIG:-/etc/cluster-telemetry-exporter/config.yaml}

cte_say() {
    printf '%s\n' "$1"
    # and to the system log, where it outlives the run
    if command -v logger >/dev/null 2>&1; then
        printf '%s\n' "$1" | logger -t cluster-telemetry-exporter-health 2>/dev/null || :
    fi
}

if [ ! -x "$CTE_BIN" ]; then
    cte_say "unknown: $CTE_BIN is not installed or not executable (set CTE_BIN in the settings file); nothing done"
    exit 0
fi
set -- health --slurm-drain
if [ -r "$CTE_CONFIG" ]; then
    set -- "$@" --config "$CTE_CONFIG"
fi
# CTE_HEALTH_ARGS is a list of flags: split on blanks on purpose
# shellcheck disable=SC2086
out=$("$CTE_BIN" "$@" $CTE_HEALTH_ARGS 2>&1)
code=$?
cte_say "$out"
# 2: a flag in CTE_HEALTH_ARGS it does not know; said above, and no reason to hold slurmd
if [ "$code" -eq 2 ]; then
    code=0
fi
exit "$code"
