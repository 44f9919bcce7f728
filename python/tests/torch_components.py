"""torch's own distributed components as clients of the collx backend, each compared with gloo in
the same run: the losses and the parameters after training must equal gloo's within float
tolerance. One process group runs every phase in turn, as a new user's script would:

    /usr/bin/python3 python/tests/torch_components.py [--np 2 3] [--transport shm tcp] [--rounds 1]
        [--phases zero hooks ...] [--timeout 20]

Phases (each builds its model from the same seed and feeds every rank its own data, seeded by
step and rank, so the two backends see the same inputs):

- zero:        DDP + ZeroRedundancyOptimizer (Adam), then every rank's parameters equal rank 0's;
- hooks:       the DDP communication hooks torch ships: allreduce_hook, fp16_compress_hook,
               bf16_compress_hook, PowerSGD with and without error feedback, each on a model of
               several buckets (batched_powerSGD_hook fails in torch 1.13 on every backend);
- join:        DDP under join() with uneven inputs (rank r takes 3 + r steps);
- graphs:      static_graph=True, and find_unused_parameters=True on a model with a branch it skips;
- local_sgd:   post-local SGD (post_localSGD_hook + PostLocalSGDOptimizer over a
               PeriodicModelAverager), and model_averaging.utils.average_parameters;
- objects:     broadcast_object_list, all_gather_object, gather_object, scatter_object_list;
- p2p:         batch_isend_irecv around the ring, both ways at once;
- many:        three DDP models with different hooks alive in one group at once: stepped
               interleaved, then one after another.

Each job's ranks are forked from this process (torch imported, no process group made). A rank
that does not finish within --timeout + 30 s counts as hung: its Python stacks (faulthandler)
and native stacks (gdb, where installed) are printed, and the run fails. The exit status is 0
only when every job finished and every comparison held.

The soak (python/bench/soak_components.py) repeats this scenario in fresh jobs many times."""
import argparse
import collections
import copy
import datetime
import faulthandler
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_here))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402

import collx_torch  # noqa: E402,F401  registers "collx"

PHASES = ["zero", "hooks", "join", "graphs", "local_sgd", "objects", "p2p", "many"]
STEPS = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- models and data --------------------------------------------------------------------------

class Branchy(nn.Module):
    """A model with a branch its forward skips on odd steps (find_unused_parameters)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 24)
        self.b = nn.Linear(24, 4)
        self.unused = nn.Linear(24, 4)
        self.step = 0

    def forward(self, x):
        h = torch.tanh(self.a(x))
        out = self.b(h)
        if self.step % 2 == 0:
            out = out + self.unused(h)
        return out


def build(seed, kind="mlp"):
    torch.manual_seed(seed)
    if kind == "branchy":
        return Branchy()
    # three layers of different shapes; with a small bucket cap DDP makes several buckets
    return nn.Sequential(nn.Linear(12, 48), nn.Tanh(), nn.Linear(48, 32), nn.Tanh(), nn.Linear(32, 4))


def batch(step, rank, salt=0):
    g = torch.Generator().manual_seed(1_000_003 * step + 7919 * rank + salt)
    return torch.randn(8, 12, generator=g), torch.randn(8, 4, generator=g)


def ddp(model, **kw):
    kw.setdefault("bucket_cap_mb", 0.004)  # several buckets of ~1000 floats
    return nn.parallel.DistributedDataParallel(model, **kw)


def train(model, opt, steps, rank, salt=0, before=None):
    losses = []
    for s in range(steps):
        if before:
            before(s)
        x, y = batch(s, rank, salt)
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def params(model):
    m = model.module if hasattr(model, "module") else model
    return torch.cat([p.detach().flatten().clone() for p in m.parameters()])


# ---- the phases: each returns {name: (losses, parameters, tolerance)} ----------------------------

def phase_zero(rank, n):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    m = ddp(build(1))
    opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2)
    losses = train(m, opt, STEPS, rank)
    p = params(m)
    ref = p.clone()
    dist.broadcast(ref, 0)
    assert torch.equal(p, ref), f"rank {rank}: parameters differ from rank 0's after ZeroRedundancyOptimizer steps"
    opt.consolidate_state_dict(to=0)  # the sharded state gathered on rank 0
    if rank == 0:
        assert len(opt.state_dict()["state"]) == len(list(m.parameters())), "consolidated state misses parameters"
    return {"zero": (losses, p, 1e-5)}


def powersgd_state(ef, batched=False):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    return powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                  use_error_feedback=ef, warm_start=ef, random_seed=7)


def bf16_hook(state, bucket):
    """torch's bf16_compress_hook; under gloo, which has no bfloat16 reduction in torch 1.13
    ("Invalid scalar type"), the reference does the same rounding with a float32 sum: every
    rank's gradient rounded to bfloat16 and divided, summed, rounded to bfloat16 again."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
    if dist.get_backend() != "gloo":
        return default.bf16_compress_hook(state, bucket)
    t = bucket.buffer().to(torch.bfloat16).div_(dist.get_world_size()).float()

    def decompress(fut):
        bucket.buffer().copy_(fut.value()[0].to(torch.bfloat16))
        return bucket.buffer()

    return dist.all_reduce(t, async_op=True).get_future().then(decompress)


def hook_list():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    return [
        ("allreduce_hook", lambda: None, default.allreduce_hook, 1e-5),
        ("fp16_compress_hook", lambda: None, default.fp16_compress_hook, 2e-3),
        # torch 1.13 refuses bf16_compress_hook by its name without CUDA and NCCL 2.10
        # (DistributedDataParallel._check_comm_hook); the hook itself runs on CPU, so it is
        # registered under another name
        ("bf16_compress_hook", lambda: None, bf16_hook, 2e-2),
        ("powerSGD ef", lambda: powersgd_state(True), powerSGD.powerSGD_hook, 1e-4),
        ("powerSGD no ef", lambda: powersgd_state(False), powerSGD.powerSGD_hook, 1e-4),
        # batched_powerSGD_hook is left out: in torch 1.13 it fails its own assertion on every
        # backend, gloo included (it hands a 2-D matrix to _orthogonalize, which asserts 3-D)
    ]


def phase_hooks(rank, n):
    out = {}
    for name, state, hook, tol in hook_list():
        m = ddp(build(2))
        m.register_comm_hook(state(), hook)
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        losses = train(m, opt, STEPS, rank)
        out[name] = (losses, params(m), tol)
    return out


def phase_join(rank, n):
    m = ddp(build(3))
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with m.join():
        losses = train(m, opt, 3 + rank, rank)
    return {"join": (losses, params(m), 1e-5)}


def phase_graphs(rank, n):
    m = ddp(build(4), static_graph=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    out = {"static_graph": (train(m, opt, STEPS, rank), params(m), 1e-5)}
    b = build(5, "branchy")
    m = ddp(b, find_unused_parameters=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    out["find_unused_parameters"] = (train(m, opt, STEPS, rank, before=lambda s: setattr(b, "step", s)), params(m), 1e-5)
    return out


def phase_local_sgd(rank, n):
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post_localSGD
    from torch.distributed.algorithms.model_averaging import averagers
    from torch.distributed.algorithms.model_averaging import utils as avg_utils
    from torch.distributed.optim import PostLocalSGDOptimizer
    subgroup = dist.new_group(list(range(n)))
    m = ddp(build(6))
    m.register_comm_hook(post_localSGD.PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=2),
                         post_localSGD.post_localSGD_hook)
    opt = PostLocalSGDOptimizer(optim=torch.optim.SGD(m.parameters(), lr=0.05),
                                averager=averagers.PeriodicModelAverager(period=2, warmup_steps=2))
    out = {"post_localSGD": (train(m, opt, STEPS + 2, rank), params(m), 1e-5)}
    # model averaging by hand: a plain model, trained locally, averaged every other step
    local = build(7)
    opt = torch.optim.SGD(local.parameters(), lr=0.05)
    losses = []
    for s in range(STEPS):
        losses += train(local, opt, 1, rank, salt=s)
        if s % 2 == 1:
            avg_utils.average_parameters(iter(local.parameters()), None)
    out["average_parameters"] = (losses, params(local), 1e-5)
    return out


def phase_objects(rank, n):
    objs = [{"rank": rank, "list": list(range(rank + 1)), "text": "x" * (10 * rank)} for _ in range(1)]
    want = lambda r: {"rank": r, "list": list(range(r + 1)), "text": "x" * (10 * r)}  # noqa: E731
    b = [want(0)] if rank == 0 else [None]
    dist.broadcast_object_list(b, src=0)
    assert b == [want(0)], f"broadcast_object_list: {b}"
    g = [None] * n
    dist.all_gather_object(g, objs[0])
    assert g == [want(r) for r in range(n)], f"all_gather_object: {g}"
    root = n - 1
    gl = [None] * n if rank == root else None
    dist.gather_object(objs[0], gl, dst=root)
    if rank == root:
        assert gl == [want(r) for r in range(n)], f"gather_object: {gl}"
    got = [None]
    dist.scatter_object_list(got, [want(100 + r) for r in range(n)] if rank == 0 else None, src=0)
    assert got == [want(100 + rank)], f"scatter_object_list: {got}"
    return {}


def phase_p2p(rank, n):
    if n == 1:
        return {}
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    for k in range(3):
        a, b = torch.full((5 + k,), float(rank + 10 * k)), torch.empty(5 + k)
        c, d = torch.full((3,), float(-rank - k)), torch.empty(3)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, a, nxt), dist.P2POp(dist.irecv, b, prv),
                                       dist.P2POp(dist.isend, c, prv), dist.P2POp(dist.irecv, d, nxt)])
        for r in reqs:
            r.wait()
        assert torch.equal(b, torch.full((5 + k,), float(prv + 10 * k))), f"batch_isend_irecv forward: {b}"
        assert torch.equal(d, torch.full((3,), float(-nxt - k))), f"batch_isend_irecv backward: {d}"
    return {}


def phase_many(rank, n):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    out = {}
    for order in ("interleaved", "in turn"):
        ms = [ddp(build(8)), ddp(build(9)), ddp(build(10))]
        ms[0].register_comm_hook(None, default.allreduce_hook)
        ms[1].register_comm_hook(powersgd_state(True), powerSGD.powerSGD_hook)
        ms[2].register_comm_hook(None, default.fp16_compress_hook)
        opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in ms]
        losses = [[] for _ in ms]
        if order == "interleaved":
            for s in range(STEPS):
                for i, (m, o) in enumerate(zip(ms, opts)):
                    losses[i] += train(m, o, 1, rank, salt=100 * i + s)
        else:
            for i, (m, o) in enumerate(zip(ms, opts)):
                for s in range(STEPS):
                    losses[i] += train(m, o, 1, rank, salt=100 * i + s)
        for i, m in enumerate(ms):
            out[f"{order} model {i}"] = (losses[i], params(m), 2e-3 if i == 2 else 1e-4)
    return out


# ---- running a job ----------------------------------------------------------------------------

def _rank_main(rank, n, backend, env, out, rounds, phases, timeout_s):
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ.update(env)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=timeout_s))
    results = []
    for _ in range(rounds):
        r = {}
        for ph in phases:
            r.update(globals()["phase_" + ph](rank, n))
        results.append(r)
    torch.save(results, f"{out}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


def native_stacks(pid):
    try:
        r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 12"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        return "\n".join(l for l in r.stdout.splitlines() if l.startswith(("#", "Thread")))
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no native stacks: {e})"


def run_job(backend, n, phases, rounds, transport=None, timeout_s=20, d="."):
    """Runs the phases on n forked ranks; returns each rank's results, or raises naming the hung
    or failed ranks (with their stacks)."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "COLLX_TIMEOUT_S": str(timeout_s)}
    if transport:
        env["COLLX_TORCH_TRANSPORT"] = transport
    out = os.path.join(d, f"{backend}-{transport}-{n}")
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=_rank_main, args=(r, n, backend, env, out, rounds, phases, timeout_s)) for r in range(n)]
    for p in ps:
        p.start()
    deadline = time.monotonic() + timeout_s * rounds * len(phases) + 30
    for p in ps:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(ps) if p.is_alive()]
    report = ""
    if hung:
        for r in hung:
            report += f"\n-- rank {r} (pid {ps[r].pid}), native stacks:\n{native_stacks(ps[r].pid)}"
            os.kill(ps[r].pid, signal.SIGUSR1)  # its Python stacks, on its stderr
        time.sleep(1)
    for p in ps:
        if p.is_alive():
            p.kill()
        p.join()
    if hung:
        raise AssertionError(f"{backend} ({transport or 'its own transport'}) at {n} ranks: rank(s) {hung} hung{report}")
    codes = {r: p.exitcode for r, p in enumerate(ps)}
    if any(codes.values()):
        raise AssertionError(f"{backend} ({transport or 'its own transport'}) at {n} ranks: exit codes {codes}")
    return [torch.load(f"{out}.{r}") for r in range(n)]


def compare(ref, got, what):
    """Every rank's every phase: losses and parameters within the phase's tolerance of gloo's."""
    bad = []
    for rank, (rr, gr) in enumerate(zip(ref, got)):
        for round_, g in enumerate(gr):
            r = rr[0]  # gloo ran one round; every collx round must equal it
            if set(r) != set(g):
                bad.append(f"rank {rank} round {round_}: phases {sorted(g)} vs gloo's {sorted(r)}")
                continue
            for name in r:
                (lr, pr, tol), (lg, pg, _) = r[name], g[name]
                ok = len(lr) == len(lg) and all(abs(a - b) <= tol * max(1.0, abs(a)) for a, b in zip(lr, lg))
                ok = ok and pr.shape == pg.shape and torch.allclose(pr, pg, rtol=tol, atol=tol)
                if not ok:
                    diff = (pr - pg).abs().max().item() if pr.shape == pg.shape else float("nan")
                    bad.append(f"{what}, rank {rank}, round {round_}, {name}: losses {lg} vs gloo's {lr}; "
                               f"largest parameter difference {diff:.3g} (tolerance {tol})")
    return bad


def scenario(nps, transports, phases, rounds, timeout_s, quiet=False):
    """Runs gloo once and collx over each transport at each size; returns the list of failures."""
    failures = []
    with tempfile.TemporaryDirectory() as d:
        for n in nps:
            t0 = time.monotonic()
            try:
                ref = run_job("gloo", n, phases, 1, timeout_s=timeout_s, d=d)
            except AssertionError as e:
                failures.append(f"gloo at {n} ranks failed (the reference): {e}")
                continue
            tg = time.monotonic() - t0
            for tr in transports:
                t0 = time.monotonic()
                try:
                    got = run_job("collx", n, phases, rounds, transport=tr, timeout_s=timeout_s, d=d)
                    bad = compare(ref, got, f"collx over {tr} at {n} ranks")
                except AssertionError as e:
                    bad = [str(e)]
                failures += bad
                if not quiet:
                    print(f"{'ok    ' if not bad else 'FAILED'}  {n} ranks, collx over {tr}: {', '.join(phases)}, {rounds} round(s) "
                          f"in {time.monotonic() - t0:.1f} s (gloo, one round: {tg:.1f} s)", flush=True)
                    for b in bad:
                        print("    " + b.replace("\n", "\n    "), flush=True)
    return failures


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, nargs="+", default=[2, 3])
    p.add_argument("--transport", nargs="+", default=["shm", "tcp"])
    p.add_argument("--phases", nargs="+", default=PHASES, choices=PHASES)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--timeout", type=float, default=20, help="COLLX_TIMEOUT_S and the process group's timeout")
    a = p.parse_args()
    bad = scenario(a.np, a.transport, a.phases, a.rounds, a.timeout)
    print(f"== {len(bad)} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
