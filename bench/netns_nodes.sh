#!/usr/bin/env bash
# Hosts as network namespaces: H "hosts" of L ranks each on this machine, each host a namespace
# with its own network (a veth pair to a bridge), so ranks on different hosts can only talk over
# that network; the link from each host can be limited (tc netem: a rate and a delay, as a real
# network has; tbf where the kernel has no netem: the rate alone), and its own /dev/shm. Each rank
# runs PROGRAM with torchrun-style variables (COLLX_RANK/WORLD_SIZE, MASTER_ADDR/PORT: host 0's
# address) and COLLX_NODE set to its host.
#
#   bench/netns_nodes.sh [--hosts 2] [--per-host 2] [--round-robin] [--rate 1gbit] [--delay 0.2ms] -- PROGRAM ARGS...
#   bench/netns_nodes.sh --layout 3,2 [...] -- PROGRAM ARGS...     uneven hosts: 3 ranks on one, 2 on the other
#   bench/netns_nodes.sh --hosts 2 --per-host 2 --rate 1gbit --delay 0.2ms -- build/bench/collx-nodes-perf --from-env -b 64M -e 64M
#   bench/netns_nodes.sh --mpirun --layout 3,2 -- build/bench/collx-nodes-perf --from-env --check
#
# --mpirun: Open MPI's mpirun starts the ranks instead, as on a cluster: its daemon (orted) runs
# in each host (its launcher agent is a script that enters the host's namespaces, as ssh would
# log in), each host has its own host name (a UTS namespace), and the ranks get only what mpirun
# gives them: no MASTER_ADDR, no COLLX_NODE (tcp meets through mpirun's PMIx store; which ranks
# share a host comes from the host names). Open MPI's own traffic stays on the hosts' network.
#
# Needs root (ip netns, tc). Ranks' output goes to stdout, rank 0's first lines unmixed (the
# others are quiet in collx-nodes-perf). The namespaces are removed on exit, whatever happens.
set -euo pipefail
hosts=2 per=2 rr=0 rate="" delay="" layout="" mpirun=0
while [ $# -gt 0 ]; do
  case "$1" in
    --mpirun) mpirun=1; shift ;;
    --hosts) hosts=$2; shift 2 ;;
    --per-host) per=$2; shift 2 ;;
    --round-robin) rr=1; shift ;;
    --layout) layout=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "netns_nodes.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "netns_nodes.sh: no program given (after --)" >&2; exit 2; }
# rank -> host: host by host (per ranks each, or --layout's sizes), or dealt out round robin
host_of=()
if [ -n "$layout" ]; then
  IFS=, read -r -a sizes <<<"$layout"
  hosts=${#sizes[@]}
  for ((j = 0; j < hosts; j++)); do for ((k = 0; k < sizes[j]; k++)); do host_of+=($j); done; done
else
  for ((r = 0; r < hosts * per; r++)); do
    if [ $rr = 1 ]; then host_of+=($((r % hosts))); else host_of+=($((r / per))); fi
  done
fi
n=${#host_of[@]}
if ! ip netns add collx-probe-$$ 2>/dev/null; then
  echo "netns_nodes.sh: this machine does not allow network namespaces (ip netns add failed): skipped" >&2
  exit 77
fi
ip netns del collx-probe-$$
tag=cx$$
br=${tag}br
holders=()
cleanup() {
  for h in "${holders[@]}"; do kill "$h" 2>/dev/null || true; done
  for ((j = 0; j < hosts; j++)); do ip netns del ${tag}h$j 2>/dev/null || true; done
  ip link del $br 2>/dev/null || true
}
trap cleanup EXIT
ip link add $br type bridge
ip link set $br up
# mpirun stays in this namespace: its daemons reach it over the bridge
[ $mpirun = 1 ] && ip addr add 10.77.0.254/24 dev $br
for ((j = 0; j < hosts; j++)); do
  ns=${tag}h$j
  ip netns add $ns
  ip link add ${tag}v$j type veth peer name ${tag}p$j
  ip link set ${tag}v$j master $br up
  ip link set ${tag}p$j netns $ns
  ip -n $ns addr add 10.77.0.$((j + 1))/24 dev ${tag}p$j
  ip -n $ns link set ${tag}p$j up
  ip -n $ns link set lo up
  if [ -n "$delay" ]; then
    # netem: the delay, and the rate with it (a queue of 10000 packets: enough for TCP at 1 Gbit/s)
    args=(delay "$delay")
    [ -n "$rate" ] && args+=(rate "$rate")
    if ! ip netns exec $ns tc qdisc add dev ${tag}p$j root netem "${args[@]}" limit 10000 2>/dev/null; then
      echo "netns_nodes.sh: this kernel has no netem (sch_netem): --delay cannot be given; run without it" >&2
      exit 77
    fi
  elif [ -n "$rate" ]; then
    # a token bucket: the rate alone (where the kernel has no netem)
    ip netns exec $ns tc qdisc add dev ${tag}p$j root tbf rate "$rate" burst 256kb latency 50ms
  fi
done
# Each host its own /dev/shm, as separate machines have: a process per host holds a mount
# namespace (in the host's network namespace) with a fresh tmpfs there, and the host's ranks
# enter both. (Without unshare and nsenter the hosts share this machine's /dev/shm.)
shm_pid=()
if command -v unshare >/dev/null && command -v nsenter >/dev/null; then
  for ((j = 0; j < hosts; j++)); do
    f=$(mktemp)
    ip netns exec ${tag}h$j unshare -m -u --propagation private sh -c \
      "mount -t tmpfs -o size=1g tmpfs /dev/shm && hostname ${tag}h$j && echo \$\$ > $f && exec sleep 100000" &
    holders+=($!)
    for _ in $(seq 100); do [ -s "$f" ] && break; sleep 0.05; done
    shm_pid+=("$(cat "$f")")
    rm -f "$f"
  done
fi
if [ $mpirun = 1 ]; then
  if [ ${#shm_pid[@]} -ne $hosts ] || ! command -v mpirun >/dev/null; then
    echo "netns_nodes.sh: --mpirun needs unshare, nsenter and Open MPI's mpirun: skipped" >&2
    exit 77
  fi
  # The launcher agent: called as ssh would be (AGENT HOST COMMAND...), it runs the command in
  # that host's namespaces.
  agent=$(mktemp /tmp/collx-netns-agent.XXXXXX)
  {
    echo '#!/bin/sh'
    echo 'host=$1; shift'
    echo 'case $host in'
    for ((j = 0; j < hosts; j++)); do echo "  10.77.0.$((j + 1))) pid=${shm_pid[$j]} ;;"; done
    echo '  *) echo "netns agent: no host $host" >&2; exit 1 ;;'
    echo 'esac'
    echo 'exec nsenter -t $pid -m -n -u -- sh -c "$*"'
  } >"$agent"
  chmod 700 "$agent"
  trap 'cleanup; rm -f "$agent"' EXIT
  # --host: each host's address with its slot count; ranks host by host, or round robin
  count=()
  for ((j = 0; j < hosts; j++)); do count+=(0); done
  for j in "${host_of[@]}"; do count[$j]=$((count[$j] + 1)); done
  hostlist=""
  for ((j = 0; j < hosts; j++)); do hostlist+="${hostlist:+,}10.77.0.$((j + 1)):${count[$j]}"; done
  map=(--map-by slot)
  [ $rr = 1 ] && map=(--map-by node)
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np $n --host "$hostlist" "${map[@]}" \
    --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 --mca routed direct \
    --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 --mca btl self,vader,tcp \
    -x PATH "$@"
  exit $?
fi
port=$((20000 + $$ % 20000))
token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
pids=()
for ((r = 0; r < n; r++)); do
  j=${host_of[$r]}
  if [ ${#shm_pid[@]} -gt 0 ] && [ -n "${shm_pid[$j]}" ]; then enter=(nsenter -t "${shm_pid[$j]}" -m -n -u --); else enter=(ip netns exec ${tag}h$j); fi
  "${enter[@]}" env COLLX_RANK=$r COLLX_WORLD_SIZE=$n COLLX_JOB=$tag MASTER_ADDR=10.77.0.1 MASTER_PORT=$port \
    COLLX_JOB_TOKEN=$token COLLX_NODE=host$j "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
