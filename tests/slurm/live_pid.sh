# Sourced by start_cluster.sh and stop_cluster.sh: the pid in a pidfile, if that process is alive and is the
# expected program.
live_pid() {  # $1 pidfile, $2 process name
    local pf="$1" name="$2" pid
    [[ -s "$pf" ]] || return 1
    pid="$(tr -dc '0-9' 2>/dev/null <"$pf")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$name"* ]] || return 1
    echo "$pid"
}
