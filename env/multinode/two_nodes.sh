#!/usr/bin/env bash
# Two Slurm "nodes" on this one machine: rehearse a multi-node class, and test the multi-node code paths.
#
#   sudo env/multinode/two_nodes.sh up DIR             build the two nodes and start Slurm on them
#   sudo env/multinode/two_nodes.sh exec DIR 1|2 CMD   run CMD on node 1 or 2 (as that host, in its network)
#   sudo env/multinode/two_nodes.sh status DIR         namespaces, daemons, sinfo
#   sudo env/multinode/two_nodes.sh down DIR           stop everything and delete the namespaces
#   sudo env/multinode/two_nodes.sh clean-stale        delete what a killed run of `up` left behind
#
# A node is a network namespace plus its own hostname (a UTS namespace made per command by `unshare --uts`):
#   node 1 = ddlnode1, 192.0.2.1 (runs munged, slurmctld and a slurmd)
#   node 2 = ddlnode2, 192.0.2.2 (runs a slurmd)
# joined by a veth pair, each with its own /dev/shm and its own temporary folder (TMPDIR, see
# node_prefix). 192.0.2.0/24 is a documentation range: it exists only inside these namespaces, never on
# the machine's own network. Each node has its own loopback, so a server bound to 127.0.0.1 on one
# node is unreachable from the other, exactly as on a real cluster. DIR/hosts names both nodes and is
# bind-mounted on /etc/hosts in a private mount namespace of each command, so the hostnames resolve as a
# cluster's DNS would. Everything else is shared: the file system (the checkout and its venv), the users, the
# CPUs. (Not `ip netns exec`: it remounts /sys without /sys/fs/cgroup, and slurmd 22.05 then refuses to start.)
# The Slurm config comes from env/slurm/local_slurm.sh (DDLCOURSE_SLURM_NODES); state, logs and pid files
# live under DIR. Names carry the PID of the process that owns the cluster ($DDLCOURSE_MN_OWNER, default
# the caller of `up`), so two clusters never clash and `clean-stale` only removes those whose owner is gone.
# Needs root, iproute2, util-linux (unshare) and Debian's slurm-wlm + munge.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ACTION=${1:-}
PREFIX=ddlmn       # namespace names: ddlmn-<owner pid>-<node>
NET=192.0.2        # documentation range (RFC 5737), inside our namespaces only
NAMES=(ddlnode1 ddlnode2)

usage() { sed -n '2,9p' "$0" >&2; exit 2; }

need_dir() {
  [ -n "${DIR:-}" ] || usage
  mkdir -p "$DIR"/{run,log,tmp,node-tmp/1,node-tmp/2}
  chmod 1777 "$DIR/tmp" "$DIR/node-tmp/1" "$DIR/node-tmp/2"
  export SLURM_CONF="$DIR/slurm.conf"
}

ns_of() { cat "$DIR/ns$1" 2>/dev/null || true; }  # namespace of node 1|2, as recorded by `up`

wait_for() {  # wait_for SECONDS CMD...: poll until CMD succeeds
  local t=$1; shift
  for _ in $(seq 1 $((t * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}

node_prefix() {  # NODE_PREFIX=(the command line that runs a command on node 1|2)
  local i=$1 ns
  case "$i" in 1|2) ;; *) echo "node must be 1 or 2, got '$i'" >&2; return 2 ;; esac
  ns=$(ns_of "$i")
  [ -n "$ns" ] && [ -e "/run/netns/$ns" ] || { echo "node $i is not up (no namespace recorded in $DIR)" >&2; return 3; }
  # the node's network; its own hostname (UTS), /etc/hosts and /dev/shm (mount namespace); exec all the way
  # down, so the command keeps the PID of the caller's child and can be signalled by it. A private /dev/shm
  # per command, as each real node has its own: MPICH names its shared-memory segment after the job step, so
  # two "nodes" sharing the machine's /dev/shm attached the ranks of both nodes to one segment and MPI_Init
  # failed ("failed to unpack address", garbled PMI-2 requests). Jobs inherit slurmd's, so the ranks of one
  # node share theirs, and only they.
  # A private temporary folder per node, shared by everything on that node, as a real node's /tmp is:
  # DIR/node-tmp/I is bind-mounted on DIR/tmp, and TMPDIR points there, on every command of node I. So a
  # file that node 1 writes through `tempfile` is, on node 2, missing at the same path (a checkpoint in
  # node-local /tmp read back on another node fails here as on a cluster). /tmp itself stays shared:
  # the checkout and this state folder may live under it.
  NODE_PREFIX=(nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation slave --
               sh -c 'mount --bind "$1" /etc/hosts && mount -t tmpfs -o mode=1777 ddlshm /dev/shm &&
                      mount --bind "$2" "$3" && export TMPDIR="$3" &&
                      hostname "$0" && shift 3 && exec "$@"'
               "${NAMES[$((i - 1))]}" "$DIR/hosts" "$DIR/node-tmp/$i" "$DIR/tmp")
}

on_node() {  # on_node 1|2 CMD...
  local i=$1; shift
  node_prefix "$i" || return $?
  "${NODE_PREFIX[@]}" "$@"
}

kill_pid_file() {  # TERM, then KILL after 10 s, the process in a pid file
  local f=$1 p
  [ -f "$f" ] || return 0
  p=$(cat "$f" 2>/dev/null || true)
  if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p" 2>/dev/null || true
    wait_for 10 bash -c "! kill -0 $p" || kill -KILL "$p" 2>/dev/null || true
  fi
  rm -f "$f"
}

delete_ns() {  # every process in the namespace, then the namespace (the veth end goes with it)
  local ns=$1 pids _
  [ -e "/run/netns/$ns" ] || return 0
  for sig in TERM KILL; do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] || break
    # shellcheck disable=SC2086
    kill -"$sig" $pids 2>/dev/null || true
    for _ in $(seq 1 25); do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.2; done
  done
  ip netns del "$ns" 2>/dev/null || true
}

up() {
  [ "$(id -u)" = 0 ] || { echo "run as root: namespaces need it, and slurmd starts jobs as their user" >&2; exit 3; }
  local x
  for x in ip unshare munged slurmctld slurmd sinfo; do
    command -v "$x" >/dev/null || { echo "$x not found (apt-get install -y iproute2 util-linux slurm-wlm munge)" >&2; exit 3; }
  done
  need_dir
  [ -z "$(ns_of 1)$(ns_of 2)" ] || { echo "a cluster is already recorded in $DIR; run down first" >&2; exit 4; }
  local owner=${DDLCOURSE_MN_OWNER:-$PPID} i ns
  printf '127.0.0.1 localhost\n::1 localhost\n%s.1 %s\n%s.2 %s\n' "$NET" "${NAMES[0]}" "$NET" "${NAMES[1]}" > "$DIR/hosts"
  for i in 1 2; do
    ns="$PREFIX-$owner-$i"
    echo "$ns" > "$DIR/ns$i"
    ip netns add "$ns"
  done
  # one veth pair, one end created directly inside each namespace: nothing appears on the host's network
  ip link add ddl0 netns "$(ns_of 1)" type veth peer name ddl0 netns "$(ns_of 2)"
  for i in 1 2; do
    ns=$(ns_of "$i")
    ip -n "$ns" addr add "$NET.$i/24" dev ddl0
    ip -n "$ns" link set ddl0 up
    ip -n "$ns" link set lo up
  done
  DDLCOURSE_SLURM_NODES="${NAMES[0]}=$NET.1 ${NAMES[1]}=$NET.2" bash "$ROOT/env/slurm/local_slurm.sh" config "$DIR" >/dev/null
  mkdir -p "$DIR/spool/${NAMES[0]}" "$DIR/spool/${NAMES[1]}"
  local key="$DIR/munge/munge.key" sock="$DIR/munge/munge.socket"
  # daemons detach and write pid files; none may hold our stdout/stderr (a caller reading to EOF would hang)
  on_node 1 munged --force --key-file="$key" --socket="$sock" --pid-file="$DIR/run/munged.pid" \
    --seed-file="$DIR/munge/seed" --log-file="$DIR/log/munged.log" </dev/null >>"$DIR/log/start.out" 2>&1
  wait_for 10 test -S "$sock" || { echo "munged did not start" >&2; cat "$DIR/log/munged.log" >&2; exit 5; }
  on_node 1 slurmctld -f "$SLURM_CONF" -i </dev/null >>"$DIR/log/start.out" 2>&1
  for i in 1 2; do
    on_node "$i" slurmd -f "$SLURM_CONF" -N "${NAMES[$((i - 1))]}" </dev/null >>"$DIR/log/start.out" 2>&1
  done
  if ! wait_for 60 bash -c "[ \"\$($0 exec '$DIR' 1 sinfo -h -N -o %T | grep -cE '^(idle|mixed|allocated)')\" = 2 ]"; then
    echo "the two nodes did not become idle; logs:" >&2; tail -n 20 "$DIR"/log/*.log >&2
    exit 6
  fi
  echo "two nodes up: ${NAMES[0]} ($NET.1, $(ns_of 1)) and ${NAMES[1]} ($NET.2, $(ns_of 2)); SLURM_CONF=$SLURM_CONF"
}

down() {  # safe to run twice, and on a half-built cluster
  need_dir
  local i ns
  for f in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid" "$DIR/run/munged.pid"; do kill_pid_file "$f"; done
  for i in 1 2; do
    ns=$(ns_of "$i")
    [ -n "$ns" ] && delete_ns "$ns"
    rm -f "$DIR/ns$i"
  done
  echo "two nodes down ($DIR)"
}

clean_stale() {  # namespaces named by us whose owner process is gone
  local ns owner
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-[0-9]+-[0-2]$" || true); do
    owner=$(echo "$ns" | cut -d- -f2)
    if ! kill -0 "$owner" 2>/dev/null; then
      delete_ns "$ns" && echo "deleted stale $ns (owner $owner is gone)"
    fi
  done
}

case "$ACTION" in
  up) DIR=${2:-}; up ;;
  down) DIR=${2:-}; down ;;
  exec) DIR=${2:-}; [ $# -ge 4 ] || usage; need_dir; i=$3; shift 3
        node_prefix "$i" || exit $?
        exec "${NODE_PREFIX[@]}" "$@" ;;
  status) DIR=${2:-}; need_dir
          for i in 1 2; do echo "node $i: ${NAMES[$((i - 1))]} namespace=$(ns_of $i) pids: $(ip netns pids "$(ns_of $i)" 2>/dev/null | tr '\n' ' ')"; done
          on_node 1 sinfo -N || true ;;
  clean-stale) clean_stale ;;
  *) usage ;;
esac
