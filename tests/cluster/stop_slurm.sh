#!/usr/bin/env bash
# Stop the private test cluster started by start_slurm.sh: cancel its jobs, then end exactly the
# daemons whose pid files are in STATE_DIR/run (checking each pid still names that daemon, so a
# recycled pid is never signalled), and remove the /etc/slurm/slurm.conf link start_slurm.sh made
# if it still points here. Nothing else is touched; the state directory is kept unless
# --purge is given (then it is deleted after everything stopped).
#
#   bash tests/cluster/stop_slurm.sh [--purge] [STATE_DIR]     # default /tmp/phaze-slurm
set -euo pipefail
# The whole script is one { } block: bash parses it completely before running, so editing the
# file while it runs (e.g. a checkout update) cannot change what a running copy executes.
{

purge=0
if [ "${1:-}" = "--purge" ]; then purge=1; shift; fi
DIR=${1:-${PHAZE_SLURM_DIR:-/tmp/phaze-slurm}}
log() { printf 'stop_slurm: %s\n' "$*" >&2; }
[ -d "$DIR/run" ] || { log "nothing to stop: no $DIR/run"; exit 0; }
export SLURM_CONF="$DIR/etc/slurm.conf"

pid_of() {  # pid_of PIDFILE NAME -> prints the pid if it is alive and is NAME
  local pid
  [ -s "$1" ] || return 1
  pid=$(tr -dc '0-9' < "$1")
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${2:0:15}" ] || return 1
  echo "$pid"
}

# Jobs of this cluster only (SLURM_CONF points at it): their steps would outlive slurmd.
if pid_of "$DIR/run/slurmctld.pid" slurmctld >/dev/null; then
  jobs=$(squeue -h -o %A 2>/dev/null || true)
  if [ -n "$jobs" ]; then
    log "cancelling jobs: $(echo $jobs)"
    # shellcheck disable=SC2086
    scancel $jobs || true
    for _ in $(seq 60); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.5; done
  fi
fi

status=0
# Reverse start order: compute daemons first, the accounting chain last, munge (their auth) at the end.
for pair in slurmd:slurmd slurmctld:slurmctld slurmdbd:slurmdbd mysqld:mariadbd munged:munged; do
  file=${pair%%:*} name=${pair##*:}
  pidfile="$DIR/run/$file.pid"
  if ! pid=$(pid_of "$pidfile" "$name"); then
    rm -f "$pidfile"
    continue
  fi
  t0=$(date +%s.%N)
  kill -TERM "$pid"
  for _ in $(seq 120); do [ -d "/proc/$pid" ] || break; sleep 0.25; done
  if [ -d "/proc/$pid" ]; then
    log "$name ($pid) ignored SIGTERM for 30 s: SIGKILL"
    kill -KILL "$pid" || true
    status=1
  fi
  rm -f "$pidfile"
  log "stopped $name ($pid) in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
done
# The /etc/slurm/slurm.conf link start_slurm.sh made, only if it still points at this cluster.
if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$SLURM_CONF" ]; then
  rm -f /etc/slurm/slurm.conf
  log "removed link /etc/slurm/slurm.conf"
fi
if [ "$purge" = 1 ]; then
  rm -rf "$DIR"
  log "removed $DIR"
fi
exit "$status"
}
