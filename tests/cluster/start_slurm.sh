#!/usr/bin/env bash
# Start a private single-node SLURM cluster (munge + MariaDB + slurmdbd + slurmctld + slurmd) from
# Debian's packages, for testing the workflow through the Snakemake SLURM executor.
#
#   sudo bash tests/cluster/start_slurm.sh [STATE_DIR]        # default /tmp/phaze-slurm
#   source STATE_DIR/env.sh                                    # SLURM_CONF for sbatch/sacct/sinfo
#   sudo bash tests/cluster/stop_slurm.sh [STATE_DIR]
#
# Everything the cluster needs lives under STATE_DIR: configs (STATE_DIR/etc/slurm.conf, selected
# through SLURM_CONF; a real /etc/slurm/slurm.conf is never read or replaced), its own munge key
# and socket, its own MariaDB data directory on 127.0.0.1, logs, state and one pid file per daemon. Ports are
# not SLURM's defaults so a real cluster on the same host is not disturbed; override with
# PHAZE_SLURM_{CTLD,SLURMD,DBD,MYSQL}_PORT. The only system-wide effect is `apt-get install` of the
# packages when they are missing (service starts are suppressed during the install with a temporary
# /usr/sbin/policy-rc.d, created only if none exists, so apt does not start system daemons), and a
# symlink /etc/slurm/slurm.conf -> STATE_DIR/etc/slurm.conf, made only when no such file exists,
# because the executor plugin's job step hides SLURM_CONF from srun (see below).
#
# Idempotent: daemons already running from STATE_DIR (pid file alive and naming that daemon) are
# kept; with everything up this takes about a second. Needs root on Debian (or a derivative).
set -euo pipefail
# The whole script is one { } block: bash parses it completely before running, so editing the
# file while it runs (e.g. a checkout update) cannot change what a running copy executes.
{

DIR=${1:-${PHAZE_SLURM_DIR:-/tmp/phaze-slurm}}
CLUSTER=${PHAZE_SLURM_CLUSTER:-phaze}
ACCOUNT=${PHAZE_SLURM_ACCOUNT:-phaze}
PARTITION=${PHAZE_SLURM_PARTITION:-debug}
CTLD_PORT=${PHAZE_SLURM_CTLD_PORT:-16817}
SLURMD_PORT=${PHAZE_SLURM_SLURMD_PORT:-16818}
DBD_PORT=${PHAZE_SLURM_DBD_PORT:-16819}
MYSQL_PORT=${PHAZE_SLURM_MYSQL_PORT:-13306}
# Users allowed to submit (root plus whoever invoked sudo, plus PHAZE_SLURM_USERS).
USERS="root ${SUDO_USER:-} ${PHAZE_SLURM_USERS:-}"
WAIT_S=${PHAZE_SLURM_WAIT_S:-120}

log() { printf 'start_slurm: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
t_start=$(date +%s.%N)
elapsed() { awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"
[ -f /etc/debian_version ] || die "needs Debian or a derivative (apt packages munge, slurm-wlm)"

# ---------------------------------------------------------------- packages
PACKAGES="munge slurm-client slurmctld slurmd slurmdbd mariadb-server"
missing=""
for pkg in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
  log "installing:$missing"
  t_apt=$(date +%s.%N)
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    # 101 = "action forbidden": apt must not start munge/mariadb/slurm system services for us.
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  cleanup_policy() { [ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d; true; }
  trap cleanup_policy EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  # shellcheck disable=SC2086
  apt-get install -y -q --no-install-recommends $missing >/dev/null
  cleanup_policy
  trap - EXIT
  log "apt install took $(awk -v a="$t_apt" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
fi

# ---------------------------------------------------------------- layout
mkdir -p "$DIR"/{etc,run,log,munge,state,spool}
chmod 755 "$DIR"
chmod 755 "$DIR/munge"   # munged refuses a socket/key directory others can write to
export SLURM_CONF="$DIR/etc/slurm.conf"
MUNGE_SOCKET="$DIR/munge/munge.socket"
MYSQL_SOCKET="$DIR/run/mysqld.sock"
DB_PASS_FILE="$DIR/etc/db.pass"
[ -s "$DB_PASS_FILE" ] || { head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$DB_PASS_FILE"; }
chmod 600 "$DB_PASS_FILE"
DB_PASS=$(cat "$DB_PASS_FILE")
HOST=$(hostname -s)

# True if the pid file names a live process whose executable is $2 (guards against pid reuse).
running() {
  local pidfile=$1 exe=$2 pid
  [ -s "$pidfile" ] || return 1
  pid=$(tr -dc '0-9' < "$pidfile")
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  # comm, not exe: Debian installs e.g. slurmctld as an alternatives link to slurmctld-wlm.
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${exe:0:15}" ]
}

wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  local limit=$1 what=$2; shift 2
  local end=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.5
  done
}

# ---------------------------------------------------------------- munge
if [ ! -s "$DIR/munge/munge.key" ]; then
  head -c 1024 /dev/urandom > "$DIR/munge/munge.key"
fi
chmod 400 "$DIR/munge/munge.key"
if ! running "$DIR/run/munged.pid" munged; then
  log "starting munged"
  # --force: munged otherwise refuses to run as root / with a key under /tmp.
  munged --force --key-file="$DIR/munge/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed"
  wait_for 20 munged bash -c "munge -S '$MUNGE_SOCKET' -n | unmunge -S '$MUNGE_SOCKET'" \
    || die "munged did not answer; see $DIR/log/munged.log"
fi

# ---------------------------------------------------------------- MariaDB (accounting storage)
MYSQL_DATA="$DIR/mysql"
mysql_cli() { mariadb --no-defaults --socket="$MYSQL_SOCKET" -uroot "$@"; }
if ! running "$DIR/run/mysqld.pid" mariadbd; then
  if [ ! -d "$MYSQL_DATA/mysql" ]; then
    log "initialising MariaDB data directory"
    mariadb-install-db --no-defaults --datadir="$MYSQL_DATA" --user=root \
      --auth-root-authentication-method=socket --skip-test-db >"$DIR/log/mariadb-install.log" 2>&1 \
      || die "mariadb-install-db failed; see $DIR/log/mariadb-install.log"
  fi
  log "starting mariadbd"
  # Small buffers: the accounting database of a test cluster is tiny. Slurm recommends the long
  # lock wait timeout for its schema upgrades.
  setsid mariadbd --no-defaults --user=root --datadir="$MYSQL_DATA" --socket="$MYSQL_SOCKET" \
    --pid-file="$DIR/run/mysqld.pid" --port="$MYSQL_PORT" --bind-address=127.0.0.1 \
    --log-error="$DIR/log/mariadb.log" --innodb-buffer-pool-size=64M \
    --innodb-log-file-size=16M --innodb-lock-wait-timeout=900 \
    </dev/null >/dev/null 2>&1 &
  wait_for 60 mariadb mysql_cli -e 'SELECT 1' || die "MariaDB did not start; see $DIR/log/mariadb.log"
  wait_for 10 mariadb-pid test -s "$DIR/run/mysqld.pid" || die "MariaDB wrote no pid file"
fi
mysql_cli <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL

# ---------------------------------------------------------------- SLURM configs
# The node must be described exactly as slurmd detects it, or slurmctld drains it.
node_line=$(slurmd -C | head -1)   # NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=... RealMemory=...
node_cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node_line")
node_hw=$(grep -o 'Boards=[^ ]* SocketsPerBoard=[^ ]* CoresPerSocket=[^ ]* ThreadsPerCore=[^ ]*' <<<"$node_line")
node_mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")
[ -n "$node_cpus" ] && [ -n "$node_mem" ] || die "could not parse 'slurmd -C': $node_line"

cat > "$DIR/etc/slurm.conf.new" <<EOF
# Written by tests/cluster/start_slurm.sh: private single-node test cluster.
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# Containers and VMs often lack a writable cgroup tree: track processes through /proc instead.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
# The Snakemake SLURM executor polls sacct, so accounting goes through slurmdbd.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# Connections to slurmdbd authenticate through this munge socket, not AuthInfo's.
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageEnforce=associations
# Keep sbatch --comment (the plugin puts the rule name there) so sacct can show it.
AccountingStoreFlags=job_comment
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
ReturnToService=2
SlurmctldTimeout=60
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
MinJobAge=300
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$node_cpus $node_hw RealMemory=$node_mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
cat > "$DIR/etc/slurmdbd.conf.new" <<EOF
# Written by tests/cluster/start_slurm.sh.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
# A changed config means running daemons are stale: restart them (the state directory keeps jobs).
config_changed=0
for f in slurm.conf slurmdbd.conf; do
  if ! cmp -s "$DIR/etc/$f.new" "$DIR/etc/$f"; then config_changed=1; fi
  mv -f "$DIR/etc/$f.new" "$DIR/etc/$f"
done
chmod 644 "$DIR/etc/slurm.conf"
chmod 600 "$DIR/etc/slurmdbd.conf"   # slurmdbd insists: it holds the database password
# snakemake-executor-plugin-slurm-jobstep (0.6.1) strips every SLURM_* variable, SLURM_CONF
# included, before the `srun` that runs a rule inside its job, so that srun only finds the config
# at the compiled-in default path. Link it there, but never over a real one.
ETC_CONF=/etc/slurm/slurm.conf
if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" != "$SLURM_CONF" ] \
   && [[ "$(readlink "$ETC_CONF")" == */etc/slurm.conf ]]; then
  # A link left by another test cluster: replace it only if that cluster is gone.
  other=$(dirname "$(dirname "$(readlink "$ETC_CONF")")")
  if [ -f "$other/run/slurmctld.pid" ] && running "$other/run/slurmctld.pid" slurmctld; then
    die "another test cluster ($other) is running and owns $ETC_CONF; stop it with stop_slurm.sh $other"
  fi
  log "replacing stale link $ETC_CONF -> $(readlink "$ETC_CONF")"
  rm -f "$ETC_CONF"
fi
if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$SLURM_CONF" ]; then
  :
elif [ -e "$ETC_CONF" ] || [ -L "$ETC_CONF" ]; then
  die "$ETC_CONF exists (a real cluster?): not replacing it. Rules' srun inside jobs would use it"
else
  mkdir -p /etc/slurm
  ln -s "$SLURM_CONF" "$ETC_CONF"
  log "linked $ETC_CONF -> $SLURM_CONF (removed by stop_slurm.sh)"
fi
cat > "$DIR/env.sh" <<EOF
# source this to talk to the test cluster in $DIR
export SLURM_CONF=$DIR/etc/slurm.conf
EOF
if [ "$config_changed" = 1 ]; then
  for d in slurmd slurmctld slurmdbd; do
    if running "$DIR/run/$d.pid" "$d"; then
      log "config changed: restarting $d"
      pid=$(tr -dc '0-9' < "$DIR/run/$d.pid")
      kill "$pid"
      wait_for 30 "$d-exit" bash -c "! kill -0 $pid" || die "$d ($pid) did not stop"
    fi
  done
fi

# ---------------------------------------------------------------- slurmdbd + associations
if ! running "$DIR/run/slurmdbd.pid" slurmdbd; then
  log "starting slurmdbd"
  slurmdbd || die "slurmdbd failed; see $DIR/log/slurmdbd.log"
  wait_for 60 slurmdbd sacctmgr -n list cluster || die "slurmdbd did not answer; see $DIR/log/slurmdbd.log"
fi
sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" \
  || sacctmgr -i add cluster "$CLUSTER" >/dev/null
sacctmgr -n -P list account format=account | grep -qx "$ACCOUNT" \
  || sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description="phaze test" Organization=phaze >/dev/null
for u in $USERS; do
  # An association user+account on this cluster (root already exists, tied to account root).
  sacctmgr -n -P list assoc where user="$u" account="$ACCOUNT" cluster="$CLUSTER" format=user | grep -qx "$u" \
    || sacctmgr -i add user "$u" Account="$ACCOUNT" Cluster="$CLUSTER" >/dev/null
  sacctmgr -n -P list user "$u" format=defaultaccount | grep -qx "$ACCOUNT" \
    || sacctmgr -i modify user where name="$u" set DefaultAccount="$ACCOUNT" >/dev/null
done

# ---------------------------------------------------------------- slurmctld + slurmd
if ! running "$DIR/run/slurmctld.pid" slurmctld; then
  log "starting slurmctld"
  slurmctld || die "slurmctld failed; see $DIR/log/slurmctld.log"
  wait_for 60 slurmctld scontrol ping || die "slurmctld did not answer; see $DIR/log/slurmctld.log"
fi
if ! running "$DIR/run/slurmd.pid" slurmd; then
  log "starting slurmd"
  slurmd || die "slurmd failed; see $DIR/log/slurmd.log"
fi
node_idle() { sinfo -h -n "$HOST" -o %T | grep -Eqx "idle|mixed|allocated|completing"; }
if ! wait_for "$WAIT_S" node-idle node_idle; then
  sinfo -N -l >&2 || true; sinfo -R >&2 || true
  die "node $HOST is not idle after ${WAIT_S}s; see $DIR/log/slurmctld.log and slurmd.log"
fi
log "cluster '$CLUSTER' up in $(elapsed) s: partition $PARTITION, account $ACCOUNT, node $HOST ($node_cpus CPUs, $node_mem MB); export SLURM_CONF=$SLURM_CONF"
exit 0
}
