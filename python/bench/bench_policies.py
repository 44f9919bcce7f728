"""dist.all_reduce through the collx backend, policy by policy, against automatic's pick, in one job:

    bench/netns_nodes.sh --hosts 2 --per-host 2 --rate 1gbit -- \\
        /usr/bin/python3 python/bench/bench_policies.py [--sizes 8 4096 ...] [--reps 3]
    /usr/bin/python3 -m collx_torch.run --standalone --nproc_per_node 4 python/bench/bench_policies.py

The world is the collx backend, automatic's (no COLLX_ALGO); then one process group of the
collx backend per policy: COLLX_ALGO names the policy when the group makes its first call
(automatic reads it then; rank 0's counts). On hosts whose ranks share them (COLLX_NODE, or the host name), the groups are two-level
communicators (docs/nodes.md) and two_level is among the policies. For each size rank 0 prints
each policy's median time over --reps rounds (a round: a barrier, then as many calls as fit
~0.25 s, the slowest rank's mean), the best of them, and automatic's time over the best's.
float32 SUM. Takes torchrun's variables, or collx's (COLLX_RANK, COLLX_WORLD_SIZE: what
netns_nodes.sh gives each rank, with MASTER_ADDR and MASTER_PORT)."""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import collx_torch  # noqa: E402,F401

FLAT = ["ring", "recursive_halving", "tree", "recursive_doubling"]


def mean_time(t, group, iters):
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    took = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return took.item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 512, 32 << 10, 2 << 20, 64 << 20], help="bytes")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--budget", type=float, default=0.25, help="seconds of calls per round, at most")
    a = p.parse_args()
    for k, c in (("RANK", "COLLX_RANK"), ("WORLD_SIZE", "COLLX_WORLD_SIZE")):
        if k not in os.environ and c in os.environ:
            os.environ[k] = os.environ[c]
    torch.set_num_threads(1)
    os.environ.pop("COLLX_ALGO", None)
    dist.init_process_group("collx", init_method="env://")
    n, rank = dist.get_world_size(), dist.get_rank()
    dist.all_reduce(torch.ones(1))  # (automatic's setup, with no COLLX_ALGO)
    policies = ["automatic", "two_level"] + FLAT
    groups = {"automatic": dist.group.WORLD}
    for pol in policies[1:]:
        os.environ["COLLX_ALGO"] = pol
        g = dist.new_group(list(range(n)), backend="collx")
        dist.all_reduce(torch.ones(1), group=g)  # (automatic's setup: reads COLLX_ALGO now)
        groups[pol] = g
    os.environ.pop("COLLX_ALGO", None)
    if rank == 0:
        print(f"# all_reduce float32 sum through the collx backend, {n} ranks; median of {a.reps} rounds, us")
        print(f"{'bytes':>10} " + " ".join(f"{q:>18}" for q in policies) + f" {'best':>18} {'automatic/best':>14}", flush=True)
    for size in a.sizes:
        t = torch.ones(max(1, size // 4))
        for g in groups.values():  # (each policy's schedules built before the timing)
            dist.all_reduce(t, group=g)
        t0 = time.perf_counter()
        dist.all_reduce(t, group=groups["ring"])
        one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(one, op=dist.ReduceOp.MAX)
        iters = int(max(2, min(1000, a.budget / max(one.item(), 1e-7))))
        res = {q: [] for q in policies}
        for _ in range(a.reps):
            for q, g in groups.items():
                res[q].append(mean_time(t, g, iters))
        med = {q: sorted(v)[len(v) // 2] for q, v in res.items()}
        best = min((q for q in policies if q != "automatic"), key=lambda q: med[q])
        if rank == 0:
            print(f"{t.numel() * 4:>10} " + " ".join(f"{med[q] * 1e6:>18.1f}" for q in policies) +
                  f" {best:>18} {med['automatic'] / med[best]:>14.2f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
