"""The soak of issue 33: the scenario of python/tests/torch_components.py (torch's own components
one after another in one process group: ZeroRedundancyOptimizer, the DDP comm hooks with
PowerSGD, join() with uneven inputs, static and unused-parameter graphs, post-local SGD and model
averaging, the object collectives, batch_isend_irecv, several DDP models at once) run again and
again in fresh jobs, each compared with gloo, with a small COLLX_TIMEOUT_S:

    /usr/bin/python3 python/bench/soak_components.py [--runs 50] [--np 3] [--transport shm tcp]
        [--rounds 2] [--timeout 10]

A run is one job per transport (every phase --rounds times in one process group) against one
gloo job. It counts the runs that passed, the hangs (a rank that did not finish: its stacks are
printed) and the other failures (a collx error, a result that differs from gloo's), and exits 0
only when every run passed."""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch_components as tc  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--np", type=int, nargs="+", default=[3])
    p.add_argument("--transport", nargs="+", default=["shm", "tcp"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--timeout", type=float, default=10)
    a = p.parse_args()
    passed, hangs, failed = 0, 0, 0
    t0 = time.monotonic()
    for run in range(a.runs):
        bad = tc.scenario(a.np, a.transport, tc.PHASES, a.rounds, a.timeout, quiet=True)
        hung = [b for b in bad if " hung" in b.split("\n")[0]]
        hangs += len(hung)
        failed += len(bad) - len(hung)
        passed += not bad
        print(f"run {run + 1}/{a.runs}: {'passed' if not bad else 'FAILED'} ({time.monotonic() - t0:.0f} s so far)", flush=True)
        for b in bad:
            print("    " + b.replace("\n", "\n    "), flush=True)
    print(f"== {passed} of {a.runs} runs passed ({len(a.np)} size(s) x {len(a.transport)} transport(s), {a.rounds} round(s) "
          f"each, COLLX_TIMEOUT_S={a.timeout:g}); {hangs} hang(s), {failed} other failure(s); {time.monotonic() - t0:.0f} s")
    return 0 if passed == a.runs else 1


if __name__ == "__main__":
    sys.exit(main())
