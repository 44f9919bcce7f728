"""Runs ddp_train.py under torchrun with gloo and with collx, same seed and data, and compares:

    /usr/bin/python3 python/examples/compare_ddp.py [--np 2 4] [--model mlp exact] [--steps 20] [--zero]

For each rank count and model it prints the loss of every step under both backends, the largest
relative difference, and the median step times side by side with their ratio. It fails (exit 1)
when a loss differs by more than the tolerance: 0 for the exact model (integer gradients: every
backend's sum is exact), and for the others 1e-5 relative plus growth with the steps (the two
backends sum the ranks' gradients in different orders, an fp32 rounding of ~n x 2^-24 per step
that training carries forward)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))


def run(backend, nproc, model, steps, zero, batch, out, quiet=True):
    # torchrun itself, through collx_torch.run: Debian's torch 1.13 torchrun fails at start on Python 3.11
    cmd = [sys.executable, "-m", "collx_torch.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(here, "ddp_train.py"), "--backend", backend, "--model", model, "--steps", str(steps), "--out", out]
    if zero:
        cmd.append("--zero")
    if batch:
        cmd += ["--batch", str(batch)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(here), os.environ.get("PYTHONPATH")])))
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL if quiet else None)
    with open(out) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, nargs="+", default=[2, 4])
    p.add_argument("--model", nargs="+", default=["mlp", "exact"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--zero", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no per-step table")
    a = p.parse_args()
    bad = []
    with tempfile.TemporaryDirectory() as d:
        for n in a.np:
            for model in a.model:
                g = run("gloo", n, model, a.steps, a.zero, a.batch, os.path.join(d, "g.json"))
                c = run("collx", n, model, a.steps, a.zero, a.batch, os.path.join(d, "c.json"))
                worst = 0.0
                if not a.quiet:
                    print(f"\n{model}, {n} ranks{' (ZeroRedundancyOptimizer)' if a.zero else ''}: step, loss gloo, loss collx")
                for s, (lg, lc) in enumerate(zip(g["losses"], c["losses"])):
                    rel = abs(lg - lc) / max(abs(lg), 1e-30)
                    worst = max(worst, rel if lg != lc else 0.0)
                    if not a.quiet:
                        print(f"  {s:3d}  {lg:.9g}  {lc:.9g}")
                tol = 0.0 if model == "exact" else 1e-5 * (1 + len(g["losses"]))
                mg = sorted(g["step_times"])[len(g["step_times"]) // 2]
                mc = sorted(c["step_times"])[len(c["step_times"]) // 2]
                verdict = "matches" if worst <= tol else "MISMATCH"
                print(f"{model}, {n} ranks, {c['params']} parameters: largest relative loss difference {worst:.3g} "
                      f"(tolerance {tol:.3g}): {verdict}; median step gloo {mg * 1e3:.2f} ms, collx {mc * 1e3:.2f} ms, "
                      f"collx {mg / mc:.2f}x as fast")
                if worst > tol:
                    bad.append(f"{model} at {n} ranks")
    if bad:
        print("MISMATCH: " + ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
