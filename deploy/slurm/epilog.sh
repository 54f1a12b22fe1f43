#!/bin/sh
# Slurm epilog: removes the job's line from the GPU-to-job files prolog.sh wrote, and
# deletes a file once no job is left on that GPU. Other jobs' lines stay. It also removes
# the job's .jobs/<job id> file (its user, account and partition).
# Install and configure: deploy/slurm/README.md.
# ---- shared part: identical in prolog.sh and epilog.sh (a test checks) ----
# Environment:
#   SLURM_JOB_ID            the job (required; anything but [A-Za-z0-9_.+-] is refused)
#   SLURM_JOB_GPUS          the node's GPU indices given to the job, e.g. "0,1,3" (preferred)
#   CUDA_VISIBLE_DEVICES    used when SLURM_JOB_GPUS is unset; in the prolog and epilog
#                           Slurm sets it to the node's indices (a job's tasks see it
#                           renumbered from 0, so do not run this as a TaskProlog)
#   CTE_HPC_JOB_MAPPING_DIR the exporter's --hpc-job-mapping-dir
#                           (default /run/cluster-telemetry-exporter/hpc-jobs)
#   CTE_SLURM_ENV           a file of settings (below)
# A failing prolog or epilog makes Slurm drain the node, so this script never fails:
# problems go to stderr and it exits 0.

# slurmd runs its prolog and epilog with an environment of its own making (the job's
# SLURM_* variables; no PATH, none of slurmd's own variables), so the settings above come
# from a file of NAME=value lines, CTE_SLURM_ENV (default
# /etc/cluster-telemetry-exporter/slurm.env), where slurmd's environment cannot set them.
# Only CTE_* names are read; a variable already set wins; quotes around a value go.
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

CTE_DIR=${CTE_HPC_JOB_MAPPING_DIR:-/run/cluster-telemetry-exporter/hpc-jobs}

cte_log() {
    echo "cluster-telemetry-exporter ${0##*/}: $*" >&2
}

# The job id, or nothing (with a message) when it is missing or unusable.
cte_job_id() {
    case ${SLURM_JOB_ID:-} in
        "") cte_log "SLURM_JOB_ID is not set; nothing to do" ;;
        *[!A-Za-z0-9_.+-]*) cte_log "SLURM_JOB_ID has unexpected characters; nothing to do" ;;
        *) printf '%s\n' "$SLURM_JOB_ID" ;;
    esac
}

# The job's GPU indices, one a line. An entry that is a GPU UUID (GPU-8d1c...) is mapped
# to its index through nvidia-smi when that is installed and knows it; anything else
# (MIG-... UUIDs, NoDevFiles, garbage) is skipped with a message.
cte_gpu_indices() {
    cte_list=${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}
    cte_old_ifs=$IFS
    IFS=', '
    # shellcheck disable=SC2086  # split on commas on purpose; no globbing (set -f)
    set -f; set -- $cte_list; set +f
    IFS=$cte_old_ifs
    for cte_entry in "$@"; do
        case $cte_entry in
            "") ;;
            *[!0-9]*|0?*) case $cte_entry in
                    GPU-*) cte_index_of_uuid "$cte_entry" ;;
                    *) cte_log "skipping GPU entry '$cte_entry': not an index or GPU UUID" ;;
                esac ;;
            *) printf '%s\n' "$cte_entry" ;;
        esac
    done
}

cte_index_of_uuid() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        cte_index=$(nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>/dev/null |
            tr -d ' ' | awk -F, -v u="$1" '$2 == u { print $1; exit }')
        case $cte_index in
            ""|*[!0-9]*) ;;
            *) printf '%s\n' "$cte_index"; return 0 ;;
        esac
    fi
    cte_log "skipping GPU entry '$1': cannot map this UUID to an index"
}

# Replaces file $1 by stdin atomically: a temporary file in the same directory, then a
# rename, so the exporter never reads half a file. An empty stdin removes the file.
cte_replace() {
    cte_tmp="$CTE_DIR/.$(basename "$1").tmp.$$"
    if ! cat > "$cte_tmp"; then
        rm -f "$cte_tmp"
        return 1
    fi
    if [ -s "$cte_tmp" ]; then
        chmod 0644 "$cte_tmp" && mv -f "$cte_tmp" "$1"
    else
        rm -f "$cte_tmp" "$1"
    fi
}

# Runs cte_update_file for every GPU file while holding the directory's lock (flock(1),
# where installed), so two jobs starting or ending together on a shared GPU keep each
# other's lines.
cte_main() {
    cte_job=$(cte_job_id)
    [ -n "$cte_job" ] || return 0
    cte_gpus=$(cte_gpu_indices)
    [ -n "$cte_gpus" ] || return 0
    if [ ! -d "$CTE_DIR" ] && ! mkdir -p -m 0755 "$CTE_DIR"; then
        cte_log "cannot create $CTE_DIR"
        return 0
    fi
    if command -v flock >/dev/null 2>&1 && command exec 9>>"$CTE_DIR/.lock"; then
        flock -w 30 9 || cte_log "could not lock $CTE_DIR/.lock; going on unlocked"
    fi
    for cte_gpu in $cte_gpus; do
        cte_update_file "$CTE_DIR/$cte_gpu" "$cte_job" ||
            cte_log "could not update $CTE_DIR/$cte_gpu for job $cte_job"
    done
}
# ---- end of shared part ----

# Removes job $2 from file $1; removes the file when no job is left.
cte_update_file() {
    [ -f "$1" ] || return 0
    { grep -vxF -e "$2" "$1" || true; } | cte_replace "$1"
}

cte_main
cte_job=$(cte_job_id 2>/dev/null)
[ -z "$cte_job" ] || rm -f "$CTE_DIR/.jobs/$cte_job"
exit 0
