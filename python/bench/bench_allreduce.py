"""dist.all_reduce from Python, collx beside gloo in one job (the same processes, alternating):

    /usr/bin/python3 -m collx_torch.run --standalone --nproc_per_node 2 python/bench/bench_allreduce.py [--sizes 8 65536 67108864] [--reps 7]

The world is gloo; a new_group(backend="collx") of every rank is collx (its own rendezvous
through the same store). For each size, rank 0 prints the median time of --reps rounds (each
round: a barrier, then --iters calls, timed), the bus bandwidth 2(n-1)/n x bytes / time, and the
ratio gloo time / collx time. float32 tensors, SUM."""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import collx_torch  # noqa: E402,F401


def timed(t, group, iters):
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - t0) / iters


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 65536, 1 << 20, 64 << 20], help="bytes")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--only", choices=["gloo", "collx"], help="time one backend (the other's group is not made)")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    n, rank = dist.get_world_size(), dist.get_rank()
    groups = {}
    if a.only != "collx":
        groups["gloo"] = dist.group.WORLD
    if a.only != "gloo":
        groups["collx"] = dist.new_group(list(range(n)), backend="collx")
    if rank == 0:
        print(f"all_reduce float32 sum, {n} ranks; median of {a.reps} rounds")
        print(f"{'bytes':>10} {'gloo us':>10} {'collx us':>10} {'gloo busbw':>11} {'collx busbw':>12} {'gloo/collx':>10}")
    for size in a.sizes:
        t = torch.ones(max(1, size // 4))
        iters = max(3, min(1000, int(2e7 // max(size, 1))))
        res = {k: [] for k in groups}
        for _ in range(a.reps):
            for name, g in groups.items():
                res[name].append(timed(t, g, iters))
        med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
        bus = {k: 2 * (n - 1) / n * t.numel() * 4 / v / 1e9 for k, v in med.items()}
        if rank == 0 and a.only:
            print(f"{t.numel() * 4:>10} {a.only} {med[a.only] * 1e6:.1f} us, busbw {bus[a.only]:.2f} GB/s", flush=True)
        elif rank == 0:
            print(f"{t.numel() * 4:>10} {med['gloo'] * 1e6:>10.1f} {med['collx'] * 1e6:>10.1f} {bus['gloo']:>8.2f} GB/s"
                  f" {bus['collx']:>8.2f} GB/s {med['gloo'] / med['collx']:>9.2f}x", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
