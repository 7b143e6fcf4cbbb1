#!/usr/bin/env bash
# Stop the test cluster started by tests/slurm/start_cluster.sh.
#
#   sudo tests/slurm/stop_cluster.sh [STATE_DIR] [--purge]   # default /tmp/oxrl-slurm
#
# 1. cancels every job still known to slurmctld (normal scancel: SIGCONT+SIGTERM,
#    SIGKILL after KillWait) and waits until they are gone from the node,
# 2. `scontrol shutdown` (slurmctld + slurmd), then SIGTERM/SIGKILL to the pids in
#    STATE_DIR/*.pid if they are still there,
# 3. stops munged only if start_cluster.sh started it,
# 4. removes the /etc/slurm/slurm.conf link if it points to STATE_DIR,
# 5. with --purge, deletes STATE_DIR (saved state, logs).
# Safe to run when nothing is running.
set -uo pipefail

DIR=/tmp/oxrl-slurm
PURGE=0
for a in "$@"; do
    case "$a" in
        --purge) PURGE=1 ;;
        *) DIR="$a" ;;
    esac
done
DIR="$(realpath -m "$DIR")"
CONF="$DIR/slurm.conf"
export PATH="$PATH:/usr/sbin:/sbin"

log() { echo "[stop_cluster] $*" >&2; }

[[ $(id -u) -eq 0 ]] || { log "ERROR: must run as root"; exit 1; }

# shellcheck source=tests/slurm/live_pid.sh
source "$(dirname "${BASH_SOURCE[0]}")/live_pid.sh"

kill_wait=30
if [[ -f "$CONF" ]]; then
    export SLURM_CONF="$CONF"
    kw="$(sed -n 's/^KillWait=\([0-9]*\).*/\1/p' "$CONF")"
    [[ -n "$kw" ]] && kill_wait="$kw"
fi

ctld_pid="$(live_pid "$DIR/slurmctld.pid" slurmctld || true)"

if [[ -n "$ctld_pid" && -f "$CONF" ]]; then
    jobs="$(squeue -h -o '%A' 2>/dev/null | tr '\n' ' ')"
    if [[ -n "${jobs// /}" ]]; then
        log "cancelling jobs: $jobs"
        # shellcheck disable=SC2086
        scancel $jobs 2>/dev/null || true
        deadline=$((SECONDS + kill_wait + 20))
        while ((SECONDS < deadline)); do
            [[ -z "$(squeue -h -o '%A' 2>/dev/null)" ]] && break
            sleep 1
        done
        left="$(squeue -h -o '%A %T' 2>/dev/null | tr '\n' ' ')"
        [[ -n "$left" ]] && log "jobs still listed after cancel: $left"
    fi
    log "scontrol shutdown"
    scontrol shutdown >/dev/null 2>&1 || true
fi

for pair in "slurmd:$DIR/slurmd.pid" "slurmctld:$DIR/slurmctld.pid"; do
    name="${pair%%:*}"
    pf="${pair#*:}"
    pid="$(live_pid "$pf" "$name" || true)"
    [[ -z "$pid" ]] && continue
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name (pid $pid) still alive: SIGTERM"
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
    if kill -0 "$pid" 2>/dev/null; then
        log "$name (pid $pid) still alive: SIGKILL"
        kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$pf"
done

if [[ -f "$DIR/munged.started-here" ]]; then
    mpid="$(cat /run/munge/munged.pid 2>/dev/null || true)"
    if [[ -n "$mpid" ]] && [[ "$(cat "/proc/$mpid/comm" 2>/dev/null)" == munged ]]; then
        log "stopping munged (pid $mpid)"
        kill -TERM "$mpid" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$mpid" 2>/dev/null || break; sleep 0.2; done
    fi
    rm -f "$DIR/munged.started-here"
fi

if [[ -L /etc/slurm/slurm.conf && "$(readlink /etc/slurm/slurm.conf)" == "$CONF" ]]; then
    rm -f /etc/slurm/slurm.conf
fi

if ((PURGE)); then
    log "removing $DIR"
    rm -rf "$DIR"
fi
log "stopped"
exit 0
