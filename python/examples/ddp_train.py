"""DistributedDataParallel on CPU over any torch.distributed backend; run under torchrun:

    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 \\
        python/examples/ddp_train.py --backend collx --model mlp --steps 20 --out losses.json

Every rank draws its own batch from a generator seeded by (step, rank), so two runs with the
same flags see the same data whatever the backend. Rank 0 writes the mean loss over ranks of
every step, the step times and the model's size to --out (JSON). compare_ddp.py runs it with
gloo and with collx and compares.

Models: mlp (a small tanh MLP), exact (integer weights, inputs and targets with a linear loss:
every gradient, its average over 2^k ranks and the update are exact in float32, so any two
correct backends agree bit for bit), wide (an embedding table of ~50 M parameters with dense
gradients and a small head, batch 8: a step is mostly its 200 MB gradient all-reduce; an MLP of
50 M parameters is no test of communication here: its backward alone takes ~1.3 s on one core). --zero adds ZeroRedundancyOptimizer (optimizer state sharded).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


class Wide(nn.Module):
    """An embedding table of 50 M parameters with dense gradients (a recommendation model's
    shape) and a small head: little compute, 200 MB of gradient to all-reduce every step."""
    rows, dim = 12288, 4096

    def __init__(self):
        super().__init__()
        self.table = nn.EmbeddingBag(self.rows, self.dim, mode="mean")
        self.head = nn.Linear(self.dim, 16)

    def forward(self, ids):
        return self.head(self.table(ids))


def build(model, seed):
    torch.manual_seed(seed)
    if model == "mlp":
        return nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8)), (64, 8)
    if model == "exact":
        m = nn.Linear(32, 16, bias=False)
        with torch.no_grad():
            m.weight.copy_(torch.randint(-4, 5, m.weight.shape).float())
        return m, (32, 16)
    if model == "wide":
        return Wide(), (Wide.rows, 16)
    raise SystemExit(f"unknown model {model}")


def batch(model, shape, step, rank, size):
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    if model == "exact":
        return torch.randint(-3, 4, (size, shape[0]), generator=g).float(), torch.randint(-3, 4, (size, shape[1]), generator=g).float()
    if model == "wide":
        return torch.randint(0, shape[0], (size, 32), generator=g), torch.randn(size, shape[1], generator=g)
    return torch.randn(size, shape[0], generator=g), torch.randn(size, shape[1], generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="collx")
    p.add_argument("--model", default="mlp", choices=["mlp", "exact", "wide"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=0, help="per rank (default: 16, wide: 8)")
    p.add_argument("--zero", action="store_true", help="ZeroRedundancyOptimizer around Adam")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (default 25, DDP's)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the model's and its gradients' type")
    p.add_argument("--out", default="")
    a = p.parse_args()
    if a.backend == "collx":
        import collx_torch  # noqa: F401  registers the backend
    dist.init_process_group(a.backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, shape = build(a.model, 0)
    dtype = getattr(torch, a.dtype)
    model = model.to(dtype)
    # gradient_as_bucket_view: the gradients live in the buckets DDP all-reduces (no copy in and
    # out of them each step), as memory-conscious training sets it; the same for every backend
    ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True, bucket_cap_mb=a.bucket_cap_mb)
    nparams = sum(p.numel() for p in model.parameters())
    if a.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    elif a.model == "exact":
        opt = torch.optim.SGD(ddp.parameters(), lr=2.0 ** -10)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    size = a.batch or (8 if a.model == "wide" else 16)
    losses, times = [], []
    for step in range(a.steps):
        x, y = batch(a.model, shape, step, rank, size)
        x = x.to(dtype) if x.is_floating_point() else x
        y = y.to(dtype)
        t0 = time.perf_counter()
        opt.zero_grad()
        out = ddp(x)
        loss = (out * y).sum() if a.model == "exact" else ((out - y) ** 2).mean()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # the mean loss over ranks, for the record (outside the timed step)
        losses.append(float(mean.item()) / world)
    if a.zero:
        # every rank's copy of the model must be the same after the sharded steps
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        ref = flat.clone()
        dist.broadcast(ref, 0)
        if not torch.equal(flat, ref):
            raise SystemExit(f"rank {rank}: parameters differ from rank 0's after ZeroRedundancyOptimizer steps")
    # the parameters' bytes, to compare runs bit for bit (ddp_deterministic.py)
    import hashlib
    digest = hashlib.sha256(b"".join(p.detach().contiguous().view(torch.uint8).numpy().tobytes() for p in model.parameters())).hexdigest()
    if rank == 0:
        rec = dict(backend=a.backend, world=world, model=a.model, params=nparams, zero=a.zero, losses=losses, step_times=times,
                   params_sha256=digest, bucket_cap_mb=a.bucket_cap_mb, dtype=a.dtype)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(rec, f)
        med = sorted(times)[len(times) // 2]
        print(f"{a.backend}: {world} ranks, {a.model} ({nparams} parameters), {a.steps} steps, median step {med * 1e3:.2f} ms, "
              f"last loss {losses[-1]:.6g}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
