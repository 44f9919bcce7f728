"""collx's torch backend against an independent reference (torch's own arithmetic on every rank's
inputs, which each rank can rebuild), in real processes:

    /usr/bin/python3 python/tests/test_collx_torch.py [-k name]

- every collective, every dtype and op, rank counts 1, 2, 3, 5 and counts 0, 1, N-1, N+1 and a
  prime, over shm, and over tcp at 3 ranks;
- non-contiguous tensors, PREMUL_SUM, coalesced calls, batch_isend_irecv, recv from any source, new_group;
- init over env://, file:// and tcp://;
- faults: mismatched sizes give collx's error naming the ranks; a rank killed mid-training makes
  the others raise within init_process_group's timeout; /dev/shm is left clean.
"""
import datetime
import os
import signal
import socket
import sys
import tempfile
import time
import traceback

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_here))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import collx_torch  # noqa: E402,F401

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
ALL = FLOATS + INTS + [torch.bool]
OPS = {
    "SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX, "AVG": dist.ReduceOp.AVG, "BAND": dist.ReduceOp.BAND,
    "BOR": dist.ReduceOp.BOR, "BXOR": dist.ReduceOp.BXOR,
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ops_for(dtype):
    if dtype == torch.bool:
        return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    if dtype in FLOATS:
        return ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
    return list(OPS)


def data(rank, count, dtype, op="SUM"):
    """Rank `rank`'s input: small integers, so that every sum and product is exact in every dtype
    (products of at most 5 values in {1, 2}, sums of at most 5 values below 8)."""
    g = torch.Generator().manual_seed(1000 * rank + count)
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=g).bool()
    if op == "PRODUCT":
        return torch.randint(1, 3, (count,), generator=g).to(dtype)
    lo = 0 if dtype == torch.uint8 or op.startswith("B") else -7
    return torch.randint(lo, 8, (count,), generator=g).to(dtype)


def reference(n, count, dtype, op):
    """The reduction of every rank's input, in torch's arithmetic (in a wide type, then cast)."""
    xs = [data(r, count, dtype, op) for r in range(n)]
    if dtype == torch.bool:
        w = [x.to(torch.int64) for x in xs]
        f = {"SUM": max, "MAX": max, "BOR": max, "PRODUCT": min, "MIN": min, "BAND": min}
        out = w[0].clone()
        for x in w[1:]:
            if op == "BXOR":
                out = out ^ x
            else:
                out = torch.maximum(out, x) if f[op] is max else torch.minimum(out, x)
        return out.bool()
    w = [x.to(torch.float64) if dtype in FLOATS else x.to(torch.int64) for x in xs]
    out = w[0].clone()
    for x in w[1:]:
        if op in ("SUM", "AVG"):
            out = out + x
        elif op == "PRODUCT":
            out = out * x
        elif op == "MIN":
            out = torch.minimum(out, x)
        elif op == "MAX":
            out = torch.maximum(out, x)
        elif op == "BAND":
            out = out & x
        elif op == "BOR":
            out = out | x
        elif op == "BXOR":
            out = out ^ x
    if op == "AVG":
        out = out / n if dtype in FLOATS else torch.div(out, n, rounding_mode="trunc")
    return out.to(dtype)


def expect_equal(got, want, what):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        bad = (got.to(torch.float64) != want.to(torch.float64)).nonzero()
        raise AssertionError(f"{what}: got {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)};"
                             f" first difference at {bad[:1].tolist()}: {got.flatten()[:8].tolist()} vs {want.flatten()[:8].tolist()}")


def counts(n):
    return sorted({0, 1, max(n - 1, 0), n + 1, 1031})


# ---- the jobs: each runs in every rank of a spawned job ------------------------------------------

def job_reductions(rank, n):
    for dtype in ALL:
        for op in ops_for(dtype):
            for c in counts(n):
                what = f"all_reduce {op} {dtype} x{c} at {n} ranks"
                t = data(rank, c, dtype, op)
                dist.all_reduce(t, OPS[op])
                expect_equal(t, reference(n, c, dtype, op), what)
            c = 2 * n + 3
            for root in range(n):
                t = data(rank, c, dtype, op)
                dist.reduce(t, root, OPS[op])
                if rank == root:
                    expect_equal(t, reference(n, c, dtype, op), f"reduce {op} {dtype} to {root}")
                else:
                    expect_equal(t, data(rank, c, dtype, op), f"reduce {op} {dtype}: a non-root's input is untouched")
            # reduce_scatter: rank r gets block r of the reduction of everyone's n*k elements
            for k in (0, 1, 5):
                full = data(rank, n * k, dtype, op)
                want = reference(n, n * k, dtype, op)[rank * k:(rank + 1) * k]
                out = torch.empty(k, dtype=dtype)
                dist.reduce_scatter_tensor(out, full, OPS[op])
                expect_equal(out, want, f"reduce_scatter_tensor {op} {dtype} k={k}")
                out2 = torch.empty(k, dtype=dtype)
                dist.reduce_scatter(out2, list(full.split(k)) if k else [torch.empty(0, dtype=dtype)] * n, OPS[op])
                expect_equal(out2, want, f"reduce_scatter (list) {op} {dtype} k={k}")
    # coalesced: several tensors in one fused call
    ts = [data(rank, c, torch.float32) for c in (3, 0, 17, 1)]
    dist.all_reduce_coalesced(ts, dist.ReduceOp.SUM)
    for t, c in zip(ts, (3, 0, 17, 1)):
        expect_equal(t, reference(n, c, torch.float32, "SUM"), "all_reduce_coalesced")
    # PREMUL_SUM (collx::ops::premul_sum): every rank's input multiplied by its own factor (a
    # float or a one-element tensor), then summed; factors k/2 keep every product and sum exact
    def premul(c, dtype, f):
        return sum(data(r, c, dtype).to(torch.float64) * f(r) for r in range(n)).to(dtype)
    same = lambda r: 2.5
    mine = lambda r: 0.5 * (r + 1)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        for c in counts(n):
            for f, as_tensor in ((same, False), (mine, False), (mine, True)):
                factor = [torch.tensor([f(rank)], dtype=dtype)] if as_tensor else f(rank)  # (torch 1.13: a list)
                op = dist._make_nccl_premul_sum(factor)
                what = f"PREMUL_SUM {dtype} x{c} ({'tensor' if as_tensor else 'scalar'} factor)"
                t = data(rank, c, dtype)
                dist.all_reduce(t, op)
                expect_equal(t, premul(c, dtype, f), "all_reduce " + what)
                t = data(rank, c, dtype)
                root = c % n
                dist.reduce(t, root, op)
                expect_equal(t, premul(c, dtype, f) if rank == root else data(rank, c, dtype), "reduce " + what)
                out = torch.empty(c, dtype=dtype)
                dist.reduce_scatter_tensor(out, torch.cat([data(rank, c, dtype) + q for q in range(n)]), op)
                want = sum((data(r, c, dtype).to(torch.float64) + rank) * f(r) for r in range(n)).to(dtype)
                expect_equal(out, want, "reduce_scatter_tensor " + what)
    ts = [data(rank, c, torch.float32) for c in (3, 0, 17, 1)]
    dist.all_reduce_coalesced(ts, dist._make_nccl_premul_sum(mine(rank)))
    for t, c in zip(ts, (3, 0, 17, 1)):
        expect_equal(t, premul(c, torch.float32, mine), "all_reduce_coalesced PREMUL_SUM")
    # a non-contiguous tensor (every other column of a matrix) is reduced where it is
    m = torch.stack([data(rank, 6, torch.float32) for _ in range(4)])
    view = m[:, ::2]
    dist.all_reduce(view)
    want = torch.stack([reference(n, 6, torch.float32, "SUM") for _ in range(4)])[:, ::2]
    expect_equal(view.contiguous(), want, "all_reduce of a non-contiguous view")
    expect_equal(m[:, 1::2].contiguous(), torch.stack([data(rank, 6, torch.float32) for _ in range(4)])[:, 1::2].contiguous(),
                 "the view's neighbours are untouched")


def job_movers(rank, n):
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        for c in counts(n):
            for root in range(n):
                t = data(rank, c, dtype)
                dist.broadcast(t, root)
                expect_equal(t, data(root, c, dtype), f"broadcast {dtype} x{c} from {root}")
            outs = [torch.empty(c, dtype=dtype) for _ in range(n)]
            dist.all_gather(outs, data(rank, c, dtype))
            for r in range(n):
                expect_equal(outs[r], data(r, c, dtype), f"all_gather {dtype} x{c}: rank {r}'s part")
            flat = torch.empty(n * c, dtype=dtype)
            dist.all_gather_into_tensor(flat, data(rank, c, dtype))
            expect_equal(flat, torch.cat([data(r, c, dtype) for r in range(n)]), f"all_gather_into_tensor {dtype} x{c}")
            root = c % n
            g = [torch.empty(c, dtype=dtype) for _ in range(n)] if rank == root else None
            dist.gather(data(rank, c, dtype), g, root)
            if rank == root:
                for r in range(n):
                    expect_equal(g[r], data(r, c, dtype), f"gather {dtype} x{c} at {root}: rank {r}'s part")
            out = torch.empty(c, dtype=dtype)
            dist.scatter(out, [data(100 + r, c, dtype) for r in range(n)] if rank == root else None, root)
            expect_equal(out, data(100 + rank, c, dtype), f"scatter {dtype} x{c} from {root}")
    # all_gather_coalesced: output_lists[r][j] is rank r's input j
    ins = [data(rank, 3, torch.int32), data(rank, 0, torch.int32), data(rank, 5, torch.int32)]
    outs = [[torch.empty(3, dtype=torch.int32), torch.empty(0, dtype=torch.int32), torch.empty(5, dtype=torch.int32)] for _ in range(n)]
    dist.all_gather_coalesced(outs, ins)
    for r in range(n):
        for j, c in enumerate((3, 0, 5)):
            expect_equal(outs[r][j], data(r, c, torch.int32), f"all_gather_coalesced: rank {r}'s tensor {j}")
    # all_to_all_single: equal blocks, then uneven splits (rank i sends i+j+1 rows of width 3 to j)
    rows = 2
    x = torch.arange(n * rows * 3, dtype=torch.float32).reshape(n * rows, 3) + 1000 * rank
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x)
    want = torch.cat([(torch.arange(n * rows * 3, dtype=torch.float32).reshape(n * rows, 3) + 1000 * r)[rank * rows:(rank + 1) * rows]
                      for r in range(n)])
    expect_equal(y, want, "all_to_all_single (equal)")
    send = [rank + j + 1 for j in range(n)]
    recv = [i + rank + 1 for i in range(n)]
    x = torch.cat([torch.full((send[j], 3), float(100 * rank + j)) for j in range(n)])
    y = torch.empty(sum(recv), 3)
    dist.all_to_all_single(y, x, recv, send)
    want = torch.cat([torch.full((recv[i], 3), float(100 * i + rank)) for i in range(n)])
    expect_equal(y, want, "all_to_all_single (splits)")
    # all_to_all of lists with uneven sizes
    ins = [torch.full((rank + j + 1,), float(10 * rank + j)) for j in range(n)]
    outs = [torch.empty(i + rank + 1) for i in range(n)]
    dist.all_to_all(outs, ins)
    for i in range(n):
        expect_equal(outs[i], torch.full((i + rank + 1,), float(10 * i + rank)), f"all_to_all (list) from {i}")
    # send/recv around the ring, both ways at once in one batch; plain send/recv in turn
    if n > 1:
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        a, b = torch.full((7,), float(rank)), torch.empty(7)
        c, d = torch.full((4,), float(-rank)), torch.empty(4)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, a, nxt), dist.P2POp(dist.irecv, b, prv),
                                       dist.P2POp(dist.isend, c, prv), dist.P2POp(dist.irecv, d, nxt)])
        for r in reqs:
            r.wait()
        expect_equal(b, torch.full((7,), float(prv)), "batch_isend_irecv forward")
        expect_equal(d, torch.full((4,), float(-nxt)), "batch_isend_irecv backward")
        for src in range(n):
            if rank == src:
                for q in range(n):
                    if q != src:
                        dist.send(torch.full((3,), float(src * 10 + q)), q)
            else:
                t = torch.empty(3)
                dist.recv(t, src)
                expect_equal(t, torch.full((3,), float(src * 10 + rank)), f"recv from {src}")
        # receive from any source: rank 0 takes one message from every other rank, recv and
        # irecv alternately, in whatever order they come; the sender's rank is returned
        if rank == 0:
            seen = []
            for k in range(1, n):
                t = torch.full((5,), -1, dtype=torch.int64)
                if k % 2:
                    sender = dist.recv(t)
                else:
                    w = dist.irecv(t)
                    w.wait()
                    sender = w._source_rank()
                expect_equal(t, torch.arange(5, dtype=torch.int64) + 100 * sender, f"recv from any source (got rank {sender})")
                seen.append(sender)
            if sorted(seen) != list(range(1, n)):
                raise AssertionError(f"recv from any source: senders {seen}, expected each of 1..{n - 1} once")
        else:
            dist.send(torch.arange(5, dtype=torch.int64) + 100 * rank, 0)
    dist.barrier()


def job_async_and_groups(rank, n):
    # outstanding calls complete in order, each with its future holding the outputs
    ts = [torch.full((1000,), float(rank + i)) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    futs = [w.get_future() for w in works]
    for i, (w, f) in enumerate(zip(works, futs)):
        w.wait()
        assert w.is_completed()
        expect_equal(f.value()[0], torch.full((1000,), float(sum(r + i for r in range(n)))), f"future {i}")
    # new_group: a split of the world, not a new rendezvous; groups of one rank too
    evens = list(range(0, n, 2))
    g = dist.new_group(evens)
    solo = dist.new_group([n - 1])
    rev = dist.new_group(list(range(n)))
    if rank in evens:
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=g)
        expect_equal(t, torch.tensor([float(sum(evens))]), "all_reduce on new_group(evens)")
        outs = [torch.empty(1) for _ in evens]
        dist.all_gather(outs, torch.tensor([float(rank)]), group=g)
        expect_equal(torch.cat(outs), torch.tensor([float(r) for r in evens]), "all_gather on the group: group rank order")
        dist.broadcast(t, evens[-1], group=g)  # the root is a global rank
    if rank == n - 1:
        t = torch.tensor([5.0])
        dist.all_reduce(t, group=solo)
        expect_equal(t, torch.tensor([5.0]), "a group of one")
    t = torch.tensor([1.0])
    dist.all_reduce(t, group=rev)
    expect_equal(t, torch.tensor([float(n)]), "a group of everyone")
    # the world still works after the groups, and concurrently with one
    works = []
    if rank in evens:
        works.append(dist.all_reduce(torch.ones(100), group=g, async_op=True))
    w = torch.ones(100)
    works.append(dist.all_reduce(w, async_op=True))
    for x in works:
        x.wait()
    expect_equal(w, torch.full((100,), float(n)), "the world after the groups")
    pg = dist.distributed_c10d._get_default_group()
    hosts = set(os.environ.get("COLLX_NODE_OF_RANK", "").split(","))
    want = os.environ.get("COLLX_TORCH_TRANSPORT", "shm" if len(hosts) == 1 else "two_level" if len(hosts) < n else "tcp")
    assert pg.transport == want, f"transport {pg.transport}, expected {want}"


def wire_input(rank, count):
    g = torch.Generator().manual_seed(77 * rank + count)
    return (torch.rand(count, generator=g) * 2 - 1) * torch.pow(2.0, torch.randint(-6, 7, (count,), generator=g).float())


def bf16_loop(n, count, avg=False):
    """compressed<bf16>'s result: each input rounded to bf16, summed in float32 in rank order,
    (AVG: divided once), the sum rounded to bf16."""
    acc = torch.zeros(count, dtype=torch.float32)
    for r in range(n):
        acc = acc + wire_input(r, count).to(torch.bfloat16).to(torch.float32)
    if avg:
        acc = acc / n
    return acc.to(torch.bfloat16).to(torch.float32)


def job_wire(rank, n):
    """COLLX_WIRE=bf16 in the environment (run's extra_env): the world's float32 SUM and AVG
    all-reduces travel as bf16; a group with Options(wire="mxfp8") as MXFP8, one with
    Options(wire="none") as float; other dtypes and ops are untouched."""
    import warnings
    warnings.filterwarnings("ignore", message=".*all_reduce_coalesced will be deprecated")
    world = dist.group.WORLD
    assert world.wire == "bf16", world.wire
    for count in counts(n):
        x = wire_input(rank, count)
        dist.all_reduce(x)
        expect_equal(x, bf16_loop(n, count), f"all_reduce SUM under COLLX_WIRE=bf16, count {count}")
        y = wire_input(rank, count)
        dist.all_reduce(y, op=dist.ReduceOp.AVG)
        expect_equal(y, bf16_loop(n, count, avg=True), f"all_reduce AVG under COLLX_WIRE=bf16, count {count}")
    # coalesced: each tensor as if alone (bf16's result does not depend on the layout)
    xs = [wire_input(rank, c) for c in (1, 1001, 7)]
    dist.all_reduce_coalesced(xs)
    for x, c in zip(xs, (1, 1001, 7)):
        expect_equal(x, bf16_loop(n, c), f"all_reduce_coalesced under COLLX_WIRE=bf16, part of {c}")
    # float64 and MAX stay exact
    d = data(rank, 1001, torch.float64)
    dist.all_reduce(d)
    expect_equal(d, reference(n, 1001, torch.float64, "SUM"), "float64 SUM under COLLX_WIRE=bf16")
    m = wire_input(rank, 1001)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    expect_equal(m, torch.stack([wire_input(r, 1001) for r in range(n)]).max(0).values, "float32 MAX under COLLX_WIRE=bf16")
    # a group of its own format: MXFP8 within its bound; float: exact
    g8 = dist.new_group(list(range(n)), pg_options=collx_torch.Options(wire="mxfp8"))
    assert g8.wire == "mxfp8", g8.wire
    z = wire_input(rank, 100003)
    dist.all_reduce(z, group=g8)
    xs = torch.stack([wire_input(r, 100003).double() for r in range(n)])
    exact, mag = xs.sum(0), xs.abs().sum(0)
    # per element: 2^-4 of each input and of the sum, plus e4m3's half subnormal step at the
    # scales (at most 2 x a block's amax / 448, blocks of 32)
    amax = mag.reshape(-1)[: (100003 // 32) * 32].reshape(-1, 32).max(1).values.repeat_interleave(32)
    amax = torch.cat([amax, mag[(100003 // 32) * 32:].max().expand(100003 % 32)])
    bound = 1.001 * ((mag + exact.abs() + mag / 16) / 16 + 2 * 2 * amax * (1 + 1 / 16) / 448 / 1024)
    off = (z.double() - exact).abs()
    assert bool((off <= bound).all()), f"mxfp8: element {int((off - bound).argmax())} off by {float(off.max())}"
    gf = dist.new_group(list(range(n)), pg_options=collx_torch.Options(wire="none"))
    f = data(rank, 1001, torch.float32)
    dist.all_reduce(f, group=gf)
    expect_equal(f, reference(n, 1001, torch.float32, "SUM"), "float32 SUM in a group with Options(wire='none')")
    try:
        collx_torch.Options(wire="fp4")
        raise AssertionError("Options(wire='fp4') was taken")
    except ValueError as e:
        assert "fp4" in str(e), str(e)


def job_options_deterministic(rank, n):
    """init_process_group(pg_options=Options(deterministic=True)): the world's float sums are the
    rank-order ones; a group asking for the other mode fails, naming the option."""
    assert dist.group.WORLD.deterministic
    count = 1001
    x = wire_input(rank, count) * 1000
    dist.all_reduce(x)
    acc = torch.zeros(count, dtype=torch.float32)
    for r in range(n):
        acc = acc + wire_input(r, count) * 1000
    assert torch.equal(x, acc), "deterministic: not the rank-order sum's bits"
    try:
        dist.new_group(list(range(n)), pg_options=collx_torch.Options(deterministic=False))
        raise AssertionError("a group with Options(deterministic=False) under a deterministic world was made")
    except RuntimeError as e:
        assert "deterministic" in str(e), str(e)


def past_init():
    """A collective that every rank completes only once every rank has left init_process_group,
    whose store-based barrier polls rank 0's store: a rank that fails on purpose and exits before
    then takes the store from a rank still in that barrier ("Connection reset by peer")."""
    dist.barrier()


def job_mismatch(rank, n):
    past_init()
    t = torch.ones(10 + rank)  # every rank a different size
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        msg = str(e)
        assert "all_reduce" in msg and "made different calls" in msg and "rank 0" in msg, f"not collx's mismatch message: {msg}"
        os._exit(0)  # the job is broken: leave without the teardown barrier
    raise AssertionError("mismatched sizes gave no error")


def job_killed(rank, n):
    """Rank 1 dies (SIGKILL) in the middle of training; the others must raise, within the timeout."""
    past_init()
    model = torch.nn.Linear(256, 256)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    t0 = None
    try:
        for step in range(1000):
            if step == 5:
                t0 = time.monotonic()
                if rank == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            ddp(torch.randn(32, 256)).sum().backward()
            opt.step()
    except RuntimeError as e:
        waited = time.monotonic() - t0
        assert waited < 15, f"rank {rank} took {waited:.1f} s to see the dead rank"
        assert "rank 1" in str(e) or "peer" in str(e) or "died" in str(e), f"the error does not name the lost rank: {e}"
        os._exit(0)  # the job is broken: leave without the teardown barrier
    raise AssertionError(f"rank {rank} trained 1000 steps with a dead peer")


def job_gil(rank, n):
    """Each path where the backend blocks, taken with the GIL held while an outstanding call's
    future has a Python callback (which needs the GIL to run when the call completes). Rank 1
    comes to each call 0.3 s late, so rank 0's is still running when it blocks. Each of these
    deadlocked before the backend's waits let the GIL go (and before its works stopped waiting
    when dropped); the job's deadline then fails the case."""
    import threading
    past_init()
    ext = collx_torch._ext
    seen = []

    def outstanding(group=None):
        if rank == 1:
            time.sleep(0.3)
        w = dist.all_reduce(torch.ones(100), group=group, async_op=True)
        f = w.get_future().then(lambda f: seen.append(f.value()[0][0].item()))
        if rank == 0:
            time.sleep(0.1)  # its progress thread is in the call now (a waiter would run it itself)
        return w, f

    def promptly(what, t0):
        # the job's deadline (20 s) would end a deadlock with an error; a path that took even a
        # quarter of it waited for the GIL it held
        took = time.monotonic() - t0
        assert took < 5, f"{what} took {took:.1f} s: it waited for collx with the GIL held"

    # a work dropped while its call runs (CollxWork's destructor, called by Python with the GIL)
    w, f = outstanding()
    t0 = time.monotonic()
    del w
    f.wait()
    promptly("dropping a work", t0)
    # wait() from C++ with the GIL held (DDP's reducer and other C++ callers of torch's Work)
    w, f = outstanding()
    t0 = time.monotonic()
    ext._wait_holding_gil(w)
    promptly("Work::wait from C++", t0)
    assert w.is_completed() and f.done(), "wait() returned before the call's future was complete"
    # is_completed() polled (GIL held) while another thread waits for the same work
    w, f = outstanding()
    errors = []

    def wait_for_it():
        try:
            w.wait()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t0 = time.monotonic()
    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    while not w.is_completed():
        pass
    waiter.join()
    promptly("is_completed() while another thread waits", t0)
    assert not errors, f"the waiting thread failed: {errors}"
    # a process group dropped (its destructor, GIL held) with its call outstanding
    g = dist.new_group(list(range(n)))
    w, f = outstanding(g)
    t0 = time.monotonic()
    del w
    dist.destroy_process_group(g)
    del g
    f.wait()
    promptly("dropping a process group", t0)
    assert seen == [float(n)] * 4, f"callbacks saw {seen}"


def stuck_in_python(rank, where):
    """Rank 1's Python holds the GIL for 3 s (a C call made through ctypes.PyDLL keeps it), longer
    than the deadline (1 s): with a Python callback of its last call waiting in collx's
    continuation for the GIL (where="callbacks"), or after a call it finished (where="own code").
    Rank 0's next call times out, and its report must say where rank 1 is: in Python, not in
    collx. Its flight record (dumped into COLLX_DUMP_DIR as the call fails) holds the message."""
    import ctypes
    import glob
    past_init()
    hold_gil = ctypes.PyDLL(None).usleep  # PyDLL: the GIL stays held through the call
    t = torch.ones(10)
    if rank == 1:
        w = dist.all_reduce(t, async_op=True)
        if where == "callbacks":
            w.get_future().then(lambda f: None)  # attached while the call waits for rank 0
        else:
            w.wait()
        hold_gil(3_000_000)
        try:
            w.wait()
            dist.all_reduce(t)  # rank 0 gave up on this call: it fails
        except RuntimeError:
            pass
        os._exit(0)
    time.sleep(0.3)  # rank 1's call is outstanding, its callback attached, when this one comes
    dist.all_reduce(t)
    try:
        dist.all_reduce(t)
        raise AssertionError("rank 0's call did not time out")
    except RuntimeError as e:
        msg = str(e)
    want = "rank 1 is not in collx: in Python" + (", in the callbacks of its last call's work" if where == "callbacks" else " for")
    assert want in msg, f"rank 0's error does not say '{want}': {msg}"
    dumps = " ".join(open(f).read() for f in glob.glob(os.path.join(os.environ["COLLX_DUMP_DIR"], "collx-rank0*.json")))
    assert want in dumps, f"rank 0's flight record does not say it: {dumps[:2000]}"
    os._exit(0)


def job_stuck_in_callbacks(rank, n):
    stuck_in_python(rank, "callbacks")


def job_stuck_in_own_code(rank, n):
    stuck_in_python(rank, "own code")


# ---- running jobs -----------------------------------------------------------------------------

def _rank_main(rank, n, job, init, timeout_s, env):
    os.environ.update(env)
    if "COLLX_NODE_OF_RANK" in env:  # ranks laid out on "hosts": this rank's (transport/two_level.hpp)
        os.environ["COLLX_NODE"] = env["COLLX_NODE_OF_RANK"].split(",")[rank]
    kw = dict(rank=rank, world_size=n, timeout=datetime.timedelta(seconds=timeout_s))
    if job == "job_options_deterministic":
        kw["pg_options"] = collx_torch.Options(deterministic=True)
    if init.startswith("env://"):
        dist.init_process_group("collx", init_method="env://", **kw)
    else:
        dist.init_process_group("collx", init_method=init, **kw)
    globals()[job](rank, n)
    dist.barrier()
    dist.destroy_process_group()


def collx_segments():
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("collx"))


def run(job, n, init="env://", transport=None, timeout_s=60, expect_exit=None, extra_env=None):
    """Runs job on n spawned ranks; every rank must exit 0 (or as expect_exit says, by rank)."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env.update(extra_env or {})
    if transport:
        env["COLLX_TORCH_TRANSPORT"] = transport
    before = collx_segments()
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=_rank_main, args=(r, n, job, init, timeout_s, env)) for r in range(n)]
    for p in ps:
        p.start()
    deadline = time.monotonic() + timeout_s + 60
    for p in ps:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(ps) if p.is_alive()]
    for p in ps:
        if p.is_alive():
            p.kill()
            p.join()
    if hung:
        raise AssertionError(f"{job} at {n} ranks: rank(s) {hung} did not finish within {timeout_s + 60} s (hung)")
    want = {r: 0 for r in range(n)}
    want.update(expect_exit or {})
    got = {r: p.exitcode for r, p in enumerate(ps)}
    if got != want:
        raise AssertionError(f"{job} at {n} ranks: exit codes {got}, expected {want}")
    left = [s for s in collx_segments() if s not in before]
    if left:
        raise AssertionError(f"{job} left {left} in /dev/shm")


def case_file_init(n=2):
    with tempfile.TemporaryDirectory() as d:
        run("job_async_and_groups", n, init="file://" + os.path.join(d, "rdv"))


def as_rank(job):
    """One rank started by a launcher (torchrun, mpirun): env:// from what the launcher set."""
    dist.init_process_group("collx", init_method="env://")
    globals()[job](dist.get_rank(), dist.get_world_size())
    dist.barrier()
    dist.destroy_process_group()
    return 0


def launched(cmd, n):
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(_here), os.environ.get("PYTHONPATH")])))
    before = collx_segments()
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-4000:]}")
    left = [s for s in collx_segments() if s not in before]
    if left:
        raise AssertionError(f"left {left} in /dev/shm")


def main():
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("-k", default="", help="run only the cases whose name contains this")
    p.add_argument("--as-rank", default="", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.as_rank:
        return as_rank(a.as_rank)
    me = os.path.abspath(__file__)
    cases = []
    for n in (1, 2, 3, 5):
        cases.append((f"reductions n={n}", lambda n=n: run("job_reductions", n)))
        cases.append((f"movers n={n}", lambda n=n: run("job_movers", n)))
        cases.append((f"async and groups n={n}", lambda n=n: run("job_async_and_groups", n)))
    cases += [
        ("movers over tcp n=3", lambda: run("job_movers", 3, transport="tcp")),
        ("reductions over tcp n=3", lambda: run("job_reductions", 3, transport="tcp")),
        ("async and groups over tcp n=3", lambda: run("job_async_and_groups", 3, transport="tcp")),
        # ranks on "hosts" (COLLX_NODE): shm among a host's ranks, tcp between hosts, chosen by
        # the backend itself (transport::two_level), its all_reduce then algo::automatic's
        # two-level model's
        ("reductions over two hosts of 2 ranks", lambda: run("job_reductions", 4, extra_env={"COLLX_NODE_OF_RANK": "a,a,b,b"})),
        ("movers over hosts of 3 + 2 ranks", lambda: run("job_movers", 5, extra_env={"COLLX_NODE_OF_RANK": "a,b,a,b,a"})),
        ("async and groups over hosts of 3 + 2 ranks",
         lambda: run("job_async_and_groups", 5, extra_env={"COLLX_NODE_OF_RANK": "a,a,a,b,b"})),
        ("COLLX_WIRE=bf16 and Options(wire=...): compressed float all-reduces, n=3", lambda: run("job_wire", 3, extra_env={"COLLX_WIRE": "bf16"})),
        ("COLLX_WIRE=bf16 over tcp, n=2", lambda: run("job_wire", 2, transport="tcp", extra_env={"COLLX_WIRE": "bf16"})),
        ("Options(deterministic=True): rank-order sums, n=3", lambda: run("job_options_deterministic", 3)),
        ("init over file://", case_file_init),
        ("init over tcp://", lambda: run("job_async_and_groups", 2, init=f"tcp://127.0.0.1:{free_port()}")),
        ("mismatched sizes: an error naming the ranks, over shm", lambda: run("job_mismatch", 3, timeout_s=20)),
        ("mismatched sizes: an error naming the ranks, over tcp", lambda: run("job_mismatch", 3, transport="tcp", timeout_s=20)),
        ("under torchrun, 3 ranks", lambda: launched([sys.executable, "-m", "collx_torch.run", "--standalone", "--nproc_per_node=3",
                                                      me, "--as-rank", "job_async_and_groups"], 3)),
        ("under mpirun, 3 ranks", lambda: launched(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3",
                                                    sys.executable, me, "--as-rank", "job_movers"], 3)),
        ("every blocking path with the GIL held and a Python callback outstanding, over shm", lambda: run("job_gil", 2, timeout_s=20)),
        ("every blocking path with the GIL held and a Python callback outstanding, over tcp",
         lambda: run("job_gil", 3, transport="tcp", timeout_s=20)),
        ("a rank stuck in Python in its callbacks: the desync report says so, over shm", lambda: run_stuck("callbacks", "shm")),
        ("a rank stuck in Python in its callbacks: the desync report says so, over tcp", lambda: run_stuck("callbacks", "tcp")),
        ("a rank stuck in its Python code: the desync report says so, over shm", lambda: run_stuck("own_code", "shm")),
        ("a rank stuck in its Python code: the desync report says so, over tcp", lambda: run_stuck("own_code", "tcp")),
        ("torch's own components against gloo, 2 and 3 ranks, over shm and tcp", components),
        ("a rank killed mid-training, over shm", lambda: run_killed("shm")),
        ("a rank killed mid-training, over tcp", lambda: run_killed("tcp")),
    ]
    failed = []
    for name, f in cases:
        if a.k and a.k not in name:
            continue
        t0 = time.monotonic()
        try:
            f()
            print(f"ok      {name} ({time.monotonic() - t0:.1f} s)", flush=True)
        except Exception:  # noqa: BLE001
            failed.append(name)
            print(f"FAILED  {name}\n{traceback.format_exc()}", flush=True)
    print(f"== {len(failed)} failed" + ("".join(f"\n  {x}" for x in failed) if failed else ""))
    return 1 if failed else 0


def run_stuck(where, transport):
    with tempfile.TemporaryDirectory() as d:
        run(f"job_stuck_in_{where}", 2, transport=transport, timeout_s=30, extra_env={"COLLX_DUMP_DIR": d, "COLLX_TIMEOUT_S": "1"})


def components():
    """python/tests/torch_components.py: ZeroRedundancyOptimizer, the comm hooks, join(), static
    and unused-parameter graphs, post-local SGD, object collectives, batch_isend_irecv and several
    DDP models at once, each against gloo; every phase twice in one process group."""
    import torch_components
    bad = torch_components.scenario([2, 3], ["shm", "tcp"], torch_components.PHASES, 2, 20, quiet=True)
    if bad:
        raise AssertionError("\n".join(bad))


def run_killed(transport):
    """Rank 1 kills itself; the others exit 0 only when they raised in time (job_killed)."""
    run("job_killed", 3, transport=transport, timeout_s=10, expect_exit={1: -signal.SIGKILL})


if __name__ == "__main__":
    sys.exit(main())
