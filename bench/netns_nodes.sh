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
#   bench/netns_nodes.sh --srun --hosts 3 --per-host 2 -- build/bench/collx-nodes-perf --mpi --check
#
# --mpirun: Open MPI's mpirun starts the ranks instead, as on a cluster: its daemon (orted) runs
# in each host (its launcher agent is a script that enters the host's namespaces, as ssh would
# log in), each host has its own host name (a UTS namespace), and the ranks get only what mpirun
# gives them: no MASTER_ADDR, no COLLX_NODE (tcp meets through mpirun's PMIx store; which ranks
# share a host comes from the host names). Open MPI's own traffic stays on the hosts' network.
#
# --srun: Slurm starts the ranks instead, with its PMIx (srun --mpi=pmix), as on a Slurm cluster:
# a private Slurm for the run (munged on a socket of its own, slurmctld on the bridge, a slurmd in
# each host, every file in a temporary directory; Debian: slurmctld slurmd slurm-client munge),
# srun called from host 0 as from a login node, each rank placed on its host (-m arbitrary).
# The ranks again get only what the launcher gives them.
#
# Needs root (ip netns, tc). Ranks' output goes to stdout, rank 0's first lines unmixed (the
# others are quiet in collx-nodes-perf). The namespaces are removed on exit, whatever happens.
set -euo pipefail
hosts=2 per=2 rr=0 rate="" delay="" layout="" mpirun=0 srun=0
while [ $# -gt 0 ]; do
  case "$1" in
    --mpirun) mpirun=1; shift ;;
    --srun) srun=1; shift ;;
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
if [ $srun = 1 ]; then
  for p in slurmctld slurmd srun munged sinfo; do
    command -v $p >/dev/null || { echo "netns_nodes.sh: --srun needs Slurm and MUNGE ($p not found; Debian: slurmctld slurmd slurm-client munge): skipped" >&2; exit 77; }
  done
fi
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
# mpirun (and slurmctld) stay in this namespace: the daemons in the hosts reach it over the bridge
[ $mpirun = 1 ] || [ $srun = 1 ] && ip addr add 10.77.0.254/24 dev $br
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
# --srun: each host's slurmd needs a cgroup file system to look at (ip netns exec mounts a sysfs
# of the namespace's own, without /sys/fs/cgroup; the plugins here use no cgroup, but slurmd will
# not start without one) and a temporary directory of its own (Slurm's PMIx server keeps its
# sockets there, under the same names on every host): $sl/node, a different directory on each.
host_mounts() { :; }
if [ $srun = 1 ]; then
  sl=$(mktemp -d /tmp/collx-slurm.XXXXXX)
  mkdir "$sl/node" "$sl/state"
  trap 'cleanup; rm -rf "$sl"' EXIT
  host_mounts() {
    mkdir "$sl/node-h$1"
    echo "mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd &&
          mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd && mount --bind $sl/node-h$1 $sl/node &&"
  }
fi
if command -v unshare >/dev/null && command -v nsenter >/dev/null; then
  for ((j = 0; j < hosts; j++)); do
    f=$(mktemp)
    ip netns exec ${tag}h$j unshare -m -u --propagation private sh -c \
      "mount -t tmpfs -o size=1g tmpfs /dev/shm && $(host_mounts $j) hostname ${tag}h$j && echo \$\$ > $f && exec sleep 100000" &
    holders+=($!)
    for _ in $(seq 100); do [ -s "$f" ] && break; sleep 0.05; done
    shm_pid+=("$(cat "$f")")
    rm -f "$f"
  done
fi
if [ $srun = 1 ]; then
  [ ${#shm_pid[@]} -eq $hosts ] || { echo "netns_nodes.sh: --srun needs unshare and nsenter: skipped" >&2; exit 77; }
  slurm_pids=()
  trap 'for p in "${slurm_pids[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 0.2; cleanup; rm -rf "$sl"' EXIT
  head -c 1024 /dev/urandom >"$sl/munge.key"
  chmod 400 "$sl/munge.key"
  munged --force --foreground --socket="$sl/munge.sock" --key-file="$sl/munge.key" --pid-file="$sl/munged.pid" \
    --log-file="$sl/munged.log" --seed-file="$sl/munge.seed" 2>/dev/null &
  slurm_pids+=($!)
  ctl_port=$((30000 + $$ % 15000))
  {
    echo "ClusterName=collx"
    echo "SlurmctldHost=$(hostname)(10.77.0.254)"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$sl/munge.sock"
    echo "CredType=cred/munge"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "SlurmctldPort=$ctl_port"
    echo "SlurmdPort=$((ctl_port + 1))"
    echo "StateSaveLocation=$sl/state"
    echo "TmpFS=$sl/node"
    echo "SlurmdSpoolDir=$sl/spool-%n"
    echo "SlurmctldPidFile=$sl/slurmctld.pid"
    echo "SlurmdPidFile=$sl/slurmd-%n.pid"
    echo "SlurmctldLogFile=$sl/slurmctld.log"
    echo "SlurmdLogFile=$sl/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SchedulerType=sched/builtin"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "SlurmdParameters=config_overrides"  # (the CPUs below, more than this machine has)
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    for ((j = 0; j < hosts; j++)); do echo "NodeName=${tag}h$j NodeAddr=10.77.0.$((j + 1)) CPUs=16 State=UNKNOWN"; done
    echo "PartitionName=hosts Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:16"
  } >"$sl/slurm.conf"
  export SLURM_CONF=$sl/slurm.conf
  for _ in $(seq 100); do [ -S "$sl/munge.sock" ] && break; sleep 0.05; done
  slurmctld -D -f "$SLURM_CONF" >/dev/null 2>&1 &
  slurm_pids+=($!)
  for ((j = 0; j < hosts; j++)); do
    nsenter -t "${shm_pid[$j]}" -m -n -u -- slurmd -D -f "$SLURM_CONF" >/dev/null 2>&1 &
    slurm_pids+=($!)
  done
  # every host's slurmd registered and idle, within 30 s
  for _ in $(seq 300); do
    [ "$(sinfo -h -o '%T %D' 2>/dev/null)" = "idle $hosts" ] && break
    sleep 0.1
  done
  if [ "$(sinfo -h -o '%T %D' 2>/dev/null)" != "idle $hosts" ]; then
    echo "netns_nodes.sh: --srun: the private Slurm did not come up within 30 s (sinfo: $(sinfo -h 2>&1 | tr '\n' ' '))" >&2
    tail -n 5 "$sl"/*.log >&2 || true
    exit 1
  fi
  for j in "${host_of[@]}"; do echo ${tag}h$j; done >"$sl/hostfile"
  # srun from host 0, as from a login node; -m arbitrary puts rank r on the hostfile's line r
  # (nothing of a rendezvous from here: the ranks meet through Slurm's PMIx, with a job secret)
  nsenter -t "${shm_pid[0]}" -m -n -u -- env -u MASTER_ADDR -u MASTER_PORT -u COLLX_JOB_TOKEN -u COLLX_NODE \
    COLLX_REQUIRE_SECRET=1 SLURM_HOSTFILE="$sl/hostfile" OMPI_MCA_btl=self,vader,tcp \
    OMPI_MCA_btl_tcp_if_include=10.77.0.0/24 srun --mpi=pmix -n $n -m arbitrary --time=3 "$@" && exit 0
  rc=$?
  echo "netns_nodes.sh: srun failed ($rc); the private Slurm's logs end:" >&2
  tail -n 8 "$sl"/slurm*.log >&2 || true
  exit $rc
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
