#!/usr/bin/env bash
# A real multi-node Slurm cluster on this one machine, for resilio's tests.
#
#   bash tests/slurm/testbed.sh up       # install what is missing, start, wait until all nodes are idle
#   bash tests/slurm/testbed.sh status   # daemons and node states; non-zero when something is down
#   bash tests/slurm/testbed.sh down     # stop exactly what `up` started, undo its system changes
#   bash tests/slurm/testbed.sh kill-node nI    # simulate a crash of node nI (SIGKILL slurmd + its jobs)
#   bash tests/slurm/testbed.sh start-node nI   # start node nI's slurmd again
#   bash tests/slurm/testbed.sh plugin BIN      # build slurm-plugin/ and install it (plugstack.conf), binary BIN
#
# One slurmctld, N slurmd (each in its own UTS namespace so `hostname` in a job
# prints its node name), a private munged, and (by default) accounting through
# slurmdbd and a private mariadb. Everything lives under the state dir.
# After `up`, plain `sinfo`, `sbatch`, `srun`, `scontrol`, `sacct` work from any
# shell (/etc/slurm/slurm.conf points to the testbed's configuration).
#
# Environment:
#   TESTBED_DIR         state dir                      (default /var/tmp/resilio-testbed)
#   TESTBED_NODES       number of nodes n1..nN for up  (default 4)
#   TESTBED_ACCOUNTING  1: slurmdbd + mariadb, 0: none (default 1)
#   TESTBED_TIMEOUT     seconds to wait for each stage (default 60)
#   TESTBED_PORT_BASE   first of the private TCP ports (default 16800)
#   TESTBED_DEBUG       Slurm daemons' log level       (default info)
#   TESTBED_TASK_PLUGIN Slurm's TaskPlugin             (default task/none; task/affinity binds CPUs)
#   TESTBED_KEEP_ON_FAILURE=1  leave a failed `up` running for inspection
set -euo pipefail

D=${TESTBED_DIR:-/var/tmp/resilio-testbed}
NODES=${TESTBED_NODES:-4}
ACCOUNTING=${TESTBED_ACCOUNTING:-1}
TIMEOUT=${TESTBED_TIMEOUT:-60}
PORT_BASE=${TESTBED_PORT_BASE:-16800}
DEBUG_LEVEL=${TESTBED_DEBUG:-info}
TASK_PLUGIN=${TESTBED_TASK_PLUGIN:-task/none}
CLUSTER=resilio

PORT_MARIADB=$((PORT_BASE + 6))
PORT_CTLD=$((PORT_BASE + 17))
PORT_DBD=$((PORT_BASE + 19))
PORT_NODE0=$((PORT_BASE + 20)) # node nI listens on PORT_NODE0 + I

ETC_CONF=/etc/slurm/slurm.conf
ETC_BACKUP=/etc/slurm/slurm.conf.resilio-testbed-backup
HOSTS_BEGIN="# BEGIN resilio-testbed $D"
HOSTS_END="# END resilio-testbed $D"
POLICY=/usr/sbin/policy-rc.d
POLICY_BACKUP=/usr/sbin/policy-rc.d.resilio-testbed-backup

CONF="$D/etc/slurm.conf"
SOCK="$D/munge/munge.socket"
MYSOCK="$D/mysql/mysqld.sock"

log() { printf 'testbed: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root"; }

# ---------------------------------------------------------------- helpers

pidfile() { echo "$D/run/$1.pid"; }

# alive NAME: the process recorded for NAME runs (and is still the program we started)
alive() {
  local f pid comm
  f=$(pidfile "$1")
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  running "$pid" || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  case "$1" in
    slurmd-*) [ "$comm" = slurmd ] ;;
    mariadb) [ "$comm" = mariadbd ] || [ "$comm" = mysqld ] ;;
    *) [ "$comm" = "$1" ] ;;
  esac
}

# spawn NAME CMD...: start a daemon in the foreground of its own session, record its pid.
spawn() {
  local name=$1
  shift
  # No inherited descriptor but the three: a daemon that kept one open
  # would hold it for its life (the caller's pipe, or a `flock` lock
  # around the testbed, never released again).
  (
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      [ "$fd" -gt 2 ] && eval "exec $fd>&-" 2>/dev/null
    done
    exec setsid "$@"
  ) </dev/null >>"$D/log/$name.out" 2>&1 &
  local pid=$! i
  echo "$pid" >"$(pidfile "$name")"
  # until the exec chain (setsid, unshare, sh) has reached the daemon itself
  for ((i = 0; i < 100; i++)); do
    alive "$name" && return 0
    running "$pid" || return 0
    sleep 0.05
  done
}

# wait_for DAEMON LOGFILE CMD...: poll CMD until it succeeds; fail when DAEMON (a name
# from run/, or "-") exits or TIMEOUT expires, showing the end of LOGFILE and DAEMON's .out.
wait_for() {
  local what=$1 logf=$2 deadline
  shift 2
  deadline=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if [ "$what" != - ] && ! alive "$what"; then
      log "error: $what exited during startup"
      show_log "$logf" "$D/log/$what.out"
      return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "error: timed out after ${TIMEOUT}s waiting for ${what/#-/all $NODES nodes to be idle}"
      show_log "$logf" "$D/log/$what.out"
      return 1
    fi
    sleep 0.2
  done
}

show_log() {
  local f
  for f in "$@"; do
    [ -s "$f" ] || continue
    log "---- last lines of $f"
    tail -n 25 "$f" >&2
  done
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# running PID: the process exists and is not a zombie waiting to be reaped
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

uts_of() { readlink "/proc/$1/ns/uts" 2>/dev/null; }

# pids_in_uts NS: all processes in UTS namespace NS (never our own namespace)
pids_in_uts() {
  local ns=$1 p
  [ -n "$ns" ] && [ "$ns" != "$(uts_of self)" ] || return 0
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/uts" 2>/dev/null)" = "$ns" ] && echo "${p#/proc/}"
  done
  return 0
}

# stop_pids SIGNAL-FIRST GRACE PID...: send TERM (or KILL), wait GRACE seconds, then KILL.
stop_pids() {
  local sig=$1 grace=$2 p deadline left
  shift 2
  [ $# -gt 0 ] || return 0
  kill "-$sig" "$@" 2>/dev/null || true
  deadline=$((SECONDS + grace))
  while :; do
    left=()
    for p in "$@"; do running "$p" && left+=("$p"); done
    [ ${#left[@]} -gt 0 ] || return 0
    if [ "$SECONDS" -ge "$deadline" ]; then
      kill -KILL "${left[@]}" 2>/dev/null || true
      sleep 0.2
      return 0
    fi
    sleep 0.1
  done
}

# stop_daemon NAME GRACE: stop the daemon recorded for NAME, if it is still ours.
stop_daemon() {
  local name=$1 grace=$2
  local pid
  if alive "$name"; then
    pid=$(cat "$(pidfile "$name")")
    # the daemon leads its own session and process group (spawn uses setsid): stop the
    # whole group, e.g. slurmctld's slurmscriptd
    # shellcheck disable=SC2046
    stop_pids TERM "$grace" "$pid" $(pgrep -g "$pid" || true)
  fi
  rm -f "$(pidfile "$name")"
}

# stop_node nI SIGNAL: stop slurmd of nI and everything in its UTS namespace (slurmstepd, job tasks).
stop_node() {
  local n=$1 sig=$2 ns="" pids=()
  [ -s "$D/run/slurmd-$n.uts" ] && ns=$(cat "$D/run/slurmd-$n.uts")
  if alive "slurmd-$n"; then pids+=("$(cat "$(pidfile "slurmd-$n")")"); fi
  if [ -n "$ns" ]; then
    mapfile -t -O "${#pids[@]}" pids < <(pids_in_uts "$ns")
  fi
  if [ ${#pids[@]} -gt 0 ]; then stop_pids "$sig" 3 "${pids[@]}"; fi
  rm -f "$(pidfile "slurmd-$n")"
}

node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "n$i"; done; }

# ---------------------------------------------------------------- packages

PKGS=(slurmctld slurmd slurm-client munge libslurm-dev)

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }

restore_policy() {
  if [ -e "$POLICY_BACKUP" ]; then
    mv -f "$POLICY_BACKUP" "$POLICY"
  else
    rm -f "$POLICY"
  fi
}

install_packages() {
  local want=("${PKGS[@]}") missing=() p
  [ "$ACCOUNTING" = 1 ] && want+=(slurmdbd mariadb-server)
  for p in "${want[@]}"; do installed "$p" || missing+=("$p"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  log "installing ${missing[*]}"
  # No stock service may start during the install: a policy-rc.d that says 101.
  if [ -e "$POLICY" ] && [ ! -e "$POLICY_BACKUP" ]; then mv "$POLICY" "$POLICY_BACKUP"; fi
  printf '#!/bin/sh\n# resilio testbed: no service starts during its package install\nexit 101\n' >"$POLICY"
  chmod 755 "$POLICY"
  trap restore_policy EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >"$D/log/apt.log" 2>&1 || log "warning: apt-get update failed (see $D/log/apt.log); trying the install anyway"
  if ! apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-confdef \
    -o Dpkg::Options::=--force-confold "${missing[@]}" >>"$D/log/apt.log" 2>&1; then
    show_log "$D/log/apt.log"
    die "apt-get install ${missing[*]} failed"
  fi
  restore_policy
  trap - EXIT
}

# ---------------------------------------------------------------- system changes (undone by down)

hosts_remove() {
  grep -qxF "$HOSTS_BEGIN" /etc/hosts 2>/dev/null || return 0
  local tmp
  tmp=$(mktemp)
  awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0 == b {skip = 1; next} $0 == e {skip = 0; next} !skip' /etc/hosts >"$tmp"
  cat "$tmp" >/etc/hosts # in place: /etc/hosts may be a bind mount
  rm -f "$tmp"
}

hosts_add() {
  local names
  names=$(node_names | tr '\n' ' ')
  getent hosts "$(hostname -s)" >/dev/null || names="$names$(hostname -s)"
  hosts_remove
  printf '%s\n127.0.0.1 %s\n%s\n' "$HOSTS_BEGIN" "${names% }" "$HOSTS_END" >>/etc/hosts
}

link_conf() {
  if [ ! -d /etc/slurm ]; then
    mkdir -p /etc/slurm
    touch "$D/created-etc-slurm"
  fi
  if [ -e "$ETC_CONF" ] || [ -L "$ETC_CONF" ]; then
    if [ "$(readlink "$ETC_CONF" || true)" != "$CONF" ] && [ ! -e "$ETC_BACKUP" ]; then
      mv "$ETC_CONF" "$ETC_BACKUP"
    fi
  fi
  ln -sfn "$CONF" "$ETC_CONF"
}

unlink_conf() {
  if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$CONF" ]; then rm -f "$ETC_CONF"; fi
  if [ -e "$ETC_BACKUP" ] && [ ! -e "$ETC_CONF" ]; then mv "$ETC_BACKUP" "$ETC_CONF"; fi
  if [ -e "$D/created-etc-slurm" ]; then
    rmdir /etc/slurm 2>/dev/null || true
    rm -f "$D/created-etc-slurm"
  fi
}

# ---------------------------------------------------------------- configuration

write_configs() {
  local ctl i
  ctl=$(hostname -s)
  mkdir -p "$D/etc" "$D/state"
  : >"$D/etc/plugstack.conf"
  {
    cat <<EOF
# Generated by tests/slurm/testbed.sh: do not edit, \`down\` removes it.
ClusterName=$CLUSTER
SlurmctldHost=$ctl(127.0.0.1)
SlurmctldPort=$PORT_CTLD
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SOCK,cred_expire=10
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmctldDebug=$DEBUG_LEVEL
SlurmdDebug=$DEBUG_LEVEL
PlugStackConfig=$D/etc/plugstack.conf
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=$TASK_PLUGIN
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=120
Waittime=0
JobRequeue=1
EOF
    if [ "$ACCOUNTING" = 1 ]; then
      cat <<EOF
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$PORT_DBD
# With MUNGE this names the munged socket used towards slurmdbd (the default one does not exist here).
AccountingStoragePass=$SOCK
JobCompType=jobcomp/none
EOF
    else
      echo "AccountingStorageType=accounting_storage/none"
    fi
    for ((i = 1; i <= NODES; i++)); do
      echo "NodeName=n$i NodeHostname=n$i NodeAddr=127.0.0.1 Port=$((PORT_NODE0 + i)) CPUs=4 RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
  } >"$CONF"

  if [ "$ACCOUNTING" = 1 ]; then
    cat >"$D/etc/slurmdbd.conf" <<EOF
# Generated by tests/slurm/testbed.sh
AuthType=auth/munge
AuthInfo=socket=$SOCK
DbdHost=$ctl
DbdAddr=127.0.0.1
DbdPort=$PORT_DBD
SlurmUser=root
DebugLevel=$DEBUG_LEVEL
LogFile=$D/log/slurmdbd.log
PidFile=$D/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$PORT_MARIADB
StorageUser=slurm
StoragePass=testbed
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$D/etc/slurmdbd.conf"
  fi

  for ((i = 1; i <= NODES; i++)); do mkdir -p "$D/spool/n$i"; done
}

# ---------------------------------------------------------------- daemons

start_munge() {
  mkdir -p "$D/munge"
  chmod 755 "$D/munge" # munged wants its socket dir searchable by all
  dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$D/munge/munge.key"
  spawn munged munged --foreground --key-file="$D/munge/munge.key" --socket="$SOCK" \
    --pid-file="$D/munge/munged.pid" --seed-file="$D/munge/munged.seed"
  wait_for munged /dev/null sh -c "munge -n -S '$SOCK' | unmunge -S '$SOCK'"
}

mysql_opts() {
  echo --innodb-buffer-pool-size=64M --innodb-log-file-size=32M --innodb-flush-log-at-trx-commit=0 \
    --innodb-doublewrite=0 --innodb-use-native-aio=0 --innodb-lock-wait-timeout=900 \
    --skip-log-bin --skip-name-resolve
}

start_mariadb() {
  mkdir -p "$D/mysql/data"
  # shellcheck disable=SC2046
  if ! mariadb-install-db --no-defaults --datadir="$D/mysql/data" --user=root --skip-test-db \
    --auth-root-authentication-method=socket $(mysql_opts) >"$D/log/mariadb-install.log" 2>&1; then
    show_log "$D/log/mariadb-install.log"
    die "mariadb-install-db failed"
  fi
  # shellcheck disable=SC2046
  spawn mariadb mariadbd --no-defaults --datadir="$D/mysql/data" --socket="$MYSOCK" \
    --port="$PORT_MARIADB" --bind-address=127.0.0.1 --pid-file="$D/mysql/mariadbd.pid" \
    --log-error="$D/log/mariadb.log" --user=root $(mysql_opts)
  wait_for mariadb "$D/log/mariadb.log" mariadb-admin --no-defaults -S "$MYSOCK" -u root ping
  mariadb --no-defaults -S "$MYSOCK" -u root -e "
    CREATE DATABASE slurm_acct_db;
    CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'testbed';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

start_slurmdbd() {
  SLURM_CONF="$CONF" spawn slurmdbd slurmdbd -D
  wait_for slurmdbd "$D/log/slurmdbd.log" port_open "$PORT_DBD"
  local c
  for c in "add cluster $CLUSTER" \
    "add account testers Cluster=$CLUSTER Description=testers Organization=resilio" \
    "add user root Account=testers Cluster=$CLUSTER"; do
    # shellcheck disable=SC2086
    if ! timeout 30 sacctmgr -i $c >>"$D/log/sacctmgr.log" 2>&1; then
      show_log "$D/log/sacctmgr.log" "$D/log/slurmdbd.log"
      die "sacctmgr $c failed"
    fi
  done
}

start_slurmctld() {
  spawn slurmctld slurmctld -D -f "$CONF"
  wait_for slurmctld "$D/log/slurmctld.log" scontrol ping
}

# slurmd_pids NODE: the slurmd processes started for NODE (by their command line)
slurmd_pids() {
  local p cmd
  for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = slurmd ] || continue
    cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
    [[ " $cmd" == *" -N $1 "* ]] && echo "${p#/proc/}"
  done
  return 0
}

# describe_pid PID: what the process is now (for a failure message)
describe_pid() {
  if [ -e "/proc/$1/stat" ]; then
    echo "pid $1: comm $(cat "/proc/$1/comm" 2>/dev/null), state $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null), uts $(uts_of "$1" || echo '?')"
  else
    echo "pid $1: gone"
  fi
}

# slurmd_ns PID: wait for PID to be in a UTS namespace other than ours; print it
slurmd_ns() {
  local pid=$1 tries=0 ns self
  self=$(uts_of self)
  while [ $tries -lt 400 ]; do
    ns=$(uts_of "$pid" || true)
    if [ -n "$ns" ] && [ "$ns" != "$self" ]; then
      echo "$ns"
      return 0
    fi
    running "$pid" || return 1
    tries=$((tries + 1))
    sleep 0.05
  done
  return 1
}

start_slurmd() {
  local n=$1 pid ns="" attempt other
  # Twice: a slurmd that died during its start (seen once in CI, its log
  # ending at "slurmd started") is started again rather than failing the run.
  for attempt in 1 2; do
    spawn "slurmd-$n" unshare --uts sh -c "hostname $n && exec slurmd -D -f '$CONF' -N $n"
    pid=$(cat "$(pidfile "slurmd-$n")")
    # Record the node's UTS namespace: `down` kills everything left in it (slurmstepd, job tasks).
    ns=$(slurmd_ns "$pid") && break
    # The recorded process is not the daemon (or no longer): find the node's
    # slurmd by its command line before starting another.
    for other in $(slurmd_pids "$n"); do
      if ns=$(slurmd_ns "$other"); then
        echo "$other" >"$(pidfile "slurmd-$n")"
        log "slurmd for $n runs as pid $other, not the recorded $pid"
        break 2
      fi
    done
    log "slurmd for $n did not start (attempt $attempt): $(describe_pid "$pid")"
    show_log "$D/log/slurmd-$n.out"
    ns=""
  done
  [ -n "$ns" ] || die "slurmd for $n did not start"
  echo "$ns" >"$D/run/slurmd-$n.uts"
}

all_idle() {
  local states
  states=$(timeout 10 sinfo -h -N -o '%t' 2>/dev/null) || return 1
  [ "$(grep -c . <<<"$states")" -eq "$NODES" ] && ! grep -qvx idle <<<"$states"
}

# ---------------------------------------------------------------- commands

load_env() {
  # shellcheck disable=SC1091
  [ -f "$D/up.env" ] && . "$D/up.env"
  return 0
}

daemons() {
  echo munged
  if [ "$ACCOUNTING" = 1 ]; then echo mariadb slurmdbd; fi
  echo slurmctld
  node_names | sed 's/^/slurmd-/'
}

is_up() {
  [ -f "$D/up.env" ] || return 1
  local d
  for d in $(daemons); do alive "$d" || return 1; done
}

cmd_status() {
  if [ ! -f "$D/up.env" ]; then
    echo "testbed: down (nothing running from $D)"
    return 3
  fi
  load_env
  local d bad=0 pid out
  echo "testbed: $NODES nodes, accounting=$ACCOUNTING, state dir $D"
  for d in $(daemons); do
    pid=$(cat "$(pidfile "$d")" 2>/dev/null || echo -)
    if alive "$d"; then
      printf '  %-12s pid %-8s alive\n' "$d" "$pid"
    else
      printf '  %-12s pid %-8s DEAD\n' "$d" "$pid"
      bad=1
    fi
  done
  if out=$(timeout 10 sinfo -h -N -o '%N %t' 2>&1); then
    while read -r node state; do
      printf '  %-12s %s\n' "$node" "$state"
      case "$state" in idle | alloc | mix | comp | resv | plnd) ;; *) bad=1 ;; esac
    done <<<"$out"
  else
    echo "  sinfo failed: $out"
    bad=1
  fi
  return $bad
}

cmd_down() {
  local had=0 n
  [ -d "$D/run" ] && had=1
  load_env
  if [ -d "$D/run" ]; then
    # nodes first (all of them, also ones a different TESTBED_NODES started)
    for f in "$D"/run/slurmd-*.uts "$D"/run/slurmd-*.pid; do
      [ -e "$f" ] || continue
      n=${f##*/slurmd-}
      n=${n%.*}
      stop_node "$n" TERM
      rm -f "$D/run/slurmd-$n.uts"
    done
    stop_daemon slurmctld 10
    stop_daemon slurmdbd 10
    stop_daemon mariadb 20
    stop_daemon munged 5
  fi
  hosts_remove
  unlink_conf
  if [ -d "$D" ]; then
    # keep the logs of the last run for inspection; everything else goes
    find "$D" -mindepth 1 -maxdepth 1 ! -name log -exec rm -rf {} +
  fi
  if [ $had = 1 ]; then log "down (logs of the last run kept in $D/log)"; else log "not up"; fi
}

up_failed() {
  local rc=$?
  [ "$rc" -ne 0 ] || return 0
  [ -f "$D/up.env.partial" ] && mv -f "$D/up.env.partial" "$D/up.env"
  if [ "${TESTBED_KEEP_ON_FAILURE:-0}" = 1 ]; then
    log "up failed: left as it is for inspection (TESTBED_KEEP_ON_FAILURE=1); \`down\` cleans up"
  else
    log "up failed: tearing down (TESTBED_KEEP_ON_FAILURE=1 keeps it)"
    cmd_down || true
  fi
}

cmd_up() {
  local want_nodes=$NODES want_accounting=$ACCOUNTING
  [[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "TESTBED_NODES must be a positive number, got '$NODES'"
  [[ "$ACCOUNTING" =~ ^[01]$ ]] || die "TESTBED_ACCOUNTING must be 0 or 1, got '$ACCOUNTING'"
  if [ -f "$D/up.env" ]; then
    load_env
    if is_up; then
      if [ "$NODES/$ACCOUNTING" != "$want_nodes/$want_accounting" ]; then
        log "already up with $NODES nodes, accounting=$ACCOUNTING (run \`down\` first to change that)"
      fi
      cmd_status || true
      return 0
    fi
  fi
  if [ -f "$D/up.env" ] || [ -f "$D/up.env.partial" ] || [ -n "$(ls -A "$D/run" 2>/dev/null)" ]; then
    log "found a partial testbed in $D: tearing it down first"
    cmd_down
  fi
  NODES=$want_nodes ACCOUNTING=$want_accounting
  local t0=${EPOCHREALTIME/[.,]/}

  rm -rf "$D/log" "$D/run"
  mkdir -p "$D/log" "$D/run"
  install_packages
  for p in $PORT_CTLD $(if [ "$ACCOUNTING" = 1 ]; then echo "$PORT_MARIADB $PORT_DBD"; fi) \
    $(seq $((PORT_NODE0 + 1)) $((PORT_NODE0 + NODES))); do
    port_open "$p" && die "port $p is already in use (set TESTBED_PORT_BASE)"
  done

  printf 'NODES=%q\nACCOUNTING=%q\n' "$NODES" "$ACCOUNTING" >"$D/up.env.partial"
  trap up_failed EXIT
  write_configs
  hosts_add
  link_conf
  export SLURM_CONF="$CONF"

  start_munge
  if [ "$ACCOUNTING" = 1 ]; then
    start_mariadb
    start_slurmdbd
  fi
  start_slurmctld
  local n
  for n in $(node_names); do start_slurmd "$n"; done
  mv -f "$D/up.env.partial" "$D/up.env"
  if ! wait_for - /dev/null all_idle; then
    timeout 10 sinfo -N >&2 || true
    show_log "$D/log/slurmctld.log" "$D"/log/slurmd-n1.log "$D"/log/slurmd-n1.out
    exit 1
  fi
  trap - EXIT
  printf 'testbed up: %s nodes n[1-%s] idle, partition debug, slurmctld %s:%s, accounting %s, state %s (%ss)\n' \
    "$NODES" "$NODES" "$(hostname -s)" "$PORT_CTLD" \
    "$(if [ "$ACCOUNTING" = 1 ]; then echo "on (slurmdbd :$PORT_DBD, mariadb :$PORT_MARIADB)"; else echo off; fi)" \
    "$D" "$(((${EPOCHREALTIME/[.,]/} - t0) / 1000000)).$(((${EPOCHREALTIME/[.,]/} - t0) / 100000 % 10))"
}

cmd_kill_node() {
  [ -f "$D/up.env" ] || die "testbed is not up"
  load_env
  [ -e "$D/run/slurmd-$1.uts" ] || die "no such node: $1"
  stop_node "$1" KILL
  log "node $1 killed (slurmd and everything in its namespace)"
}

cmd_start_node() {
  [ -f "$D/up.env" ] || die "testbed is not up"
  load_env
  [ -e "$D/run/slurmd-$1.uts" ] || die "no such node: $1"
  alive "slurmd-$1" && { log "node $1 already running"; return 0; }
  start_slurmd "$1"
  log "node $1 started"
}

# plugin BIN: build resilio's SPANK plugin (slurm-plugin/, against the
# installed spank.h) and install it through a plugstack.conf line, its
# binary BIN, off unless a job asks (`--resilio`). plugstack.conf is read
# at each launch: no daemon restarts.
cmd_plugin() {
  [ -f "$D/up.env" ] || die "testbed is not up"
  local bin=$1 src
  src=$(cd "$(dirname "$0")/../../slurm-plugin" && pwd)
  [ -x "$bin" ] || die "plugin: $bin is not an executable"
  make -s -C "$src" >"$D/log/plugin-build.log" 2>&1 || {
    show_log "$D/log/plugin-build.log"
    die "building the SPANK plugin failed"
  }
  printf 'optional %s/resilio_spank.so resilio=%s default=off\n' "$src" "$bin" >"$D/etc/plugstack.conf"
  log "SPANK plugin installed: $(cat "$D/etc/plugstack.conf")"
}

main() {
  local cmd=${1:-}
  case "$cmd" in
    up | down | status | kill-node | start-node | plugin) ;;
    *)
      echo "usage: $0 up|down|status|kill-node nI|start-node nI|plugin BIN" >&2
      exit 2
      ;;
  esac
  need_root
  mkdir -p "$D"
  # One invocation at a time (the lock is on the state dir; daemons never inherit fd 9).
  exec 9<"$D"
  flock -w 300 9 || die "another testbed.sh holds $D"
  case "$cmd" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    kill-node) cmd_kill_node "${2:?node name}" ;;
    start-node) cmd_start_node "${2:?node name}" ;;
    plugin) cmd_plugin "${2:?resilio binary}" ;;
  esac
}

main "$@"
