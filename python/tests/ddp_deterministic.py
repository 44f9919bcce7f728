"""DDP with COLLX_DETERMINISTIC=1: the parameters after the steps are the same bits whatever the
bucket layout, and from run to run (issue 37, docs/precision.md).

    /usr/bin/python3 python/tests/ddp_deterministic.py [--np 2 3] [--steps 20]

DDP all-reduces its gradients bucket by bucket; bucket_cap_mb decides which gradients share a
bucket, so where an element sits in the buffer a policy cuts into blocks, and so the order the
ranks' contributions are added in. In the deterministic mode every element is its ranks'
contributions added in rank order, wherever it sits. For each rank count this trains the MLP of
ddp_train.py under torchrun (collx_torch.run) with bucket_cap_mb 25 (DDP's default), 0.05 (many
small buckets) and 25 again, and checks that the three runs end with the same sha256 of the
parameters; then the same in bfloat16 (its gradients summed in float, rounded once), 25 against
0.05. Without the mode the layouts are also run and their digests printed, for comparison (not
checked: the default policies give bits that depend on the layout)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
examples = os.path.join(os.path.dirname(here), "examples")


def train(n, steps, bucket, dtype, deterministic, out):
    cmd = [sys.executable, "-m", "collx_torch.run", "--standalone", f"--nproc_per_node={n}",
           os.path.join(examples, "ddp_train.py"), "--backend", "collx", "--model", "mlp", "--steps", str(steps),
           "--bucket-cap-mb", str(bucket), "--dtype", dtype, "--out", out]
    env = dict(os.environ, OMP_NUM_THREADS="1", COLLX_DETERMINISTIC="1" if deterministic else "0",
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(here), os.environ.get("PYTHONPATH")])))
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)["params_sha256"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, nargs="+", default=[2, 3])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--compare-default", action="store_true", help="also run the layouts without the mode")
    a = p.parse_args()
    bad = []
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        for n in a.np:
            # (bfloat16 at the last rank count: at 2 ranks a + b is the same in either order)
            runs = [("float32", 25.0), ("float32", 0.05), ("float32", 25.0)] + ([("bfloat16", 25.0), ("bfloat16", 0.05)] if n == a.np[-1] else [])
            got = {}
            for dtype, bucket in runs:
                h = train(n, a.steps, bucket, dtype, True, out)
                print(f"{n} ranks, {dtype}, bucket_cap_mb {bucket:g}, COLLX_DETERMINISTIC=1: parameters {h[:16]}")
                got.setdefault(dtype, set()).add(h)
            for dtype, hs in got.items():
                if len(hs) != 1:
                    bad.append(f"{n} ranks, {dtype}: {len(hs)} different parameter digests across bucket layouts and runs")
            if a.compare_default:
                for bucket in (25.0, 0.05):
                    h = train(n, a.steps, bucket, "float32", False, out)
                    print(f"{n} ranks, float32, bucket_cap_mb {bucket:g}, default policies: parameters {h[:16]}")
    if bad:
        print("ddp_deterministic: " + "; ".join(bad))
        return 1
    print(f"ddp_deterministic: the parameters after {a.steps} steps are the same bits across bucket layouts and runs, at {a.np} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
