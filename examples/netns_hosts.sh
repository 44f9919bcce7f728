#!/usr/bin/env bash
# Runs PROGRAM tcp as N "hosts" on one machine: each rank in a network namespace of its own,
# joined to the others by a veth pair on a bridge in a further namespace (a switch), with an
# address of its own (10.77.<job>.<rank+1>/24) and its rendezvous at rank 0's address. Nothing
# is added to the machine's own namespace: traffic stays on those addresses (and each
# namespace's loopback). Needs root and iproute2; exits 77 (skipped) without them.
#   netns_hosts.sh PROGRAM N
set -u
prog=$1 n=$2
skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "network namespaces need root"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
tag=cx$(($$ % 100000))
sub=$(($$ % 200 + 20))
nss=()
cleanup() { for ns in "${nss[@]}"; do ip netns del "$ns" 2>/dev/null; done; }
trap cleanup EXIT
ip netns add "${tag}sw" 2>/dev/null || skip "cannot create network namespaces here (ip netns add failed)"
nss+=("${tag}sw")
ip -n "${tag}sw" link add br0 type bridge
ip -n "${tag}sw" link set br0 up
for ((r = 0; r < n; r++)); do
  h=${tag}h$r
  ip netns add "$h"
  nss+=("$h")
  ip -n "$h" link add eth0 type veth peer name p$r netns "${tag}sw"
  ip -n "${tag}sw" link set p$r master br0
  ip -n "${tag}sw" link set p$r up
  ip -n "$h" addr add 10.77.$sub.$((r + 1))/24 dev eth0
  ip -n "$h" link set eth0 up
  ip -n "$h" link set lo up
done
master=10.77.$sub.1
pids=()
out=$(mktemp)
for ((r = 0; r < n; r++)); do
  ip netns exec "${tag}h$r" env RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=$master MASTER_PORT=29500 \
    COLLX_SOCKET_IFNAME=eth0 COLLX_TIMEOUT_S=60 "$prog" tcp >>"$out" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$out"
# Every rank must have reached its peers at their namespace addresses.
ok=$(grep -c "ok (peer at 10\.77\.$sub\." "$out")
rm -f "$out"
((ok == n)) || { echo "netns_hosts.sh: $ok of $n ranks reported success over 10.77.$sub.0/24"; rc=1; }
exit $rc
