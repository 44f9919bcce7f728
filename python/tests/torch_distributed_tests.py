"""PyTorch's own distributed tests (DistributedTest._DistTestBase, shipped with Debian's
python3-torch) against the collx backend, the way a plugin backend runs them:

    WORLD_SIZE=2 /usr/bin/python3 python/tests/torch_distributed_tests.py [-k pattern] [--list]

Every test runs in WORLD_SIZE fresh processes (spawned, or forked with --start fork), initialised with backend "collx" over
file://. At the end every skipped test is listed with its reason; the exit status is 0 only when
no test failed or errored. Tests that torch gates on gloo's or nccl's name, on CUDA or on a
world size are skipped by torch's own decorators, and their reasons say so."""
import copy
import dataclasses
import os
import sys
import unittest

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "stubs"))
sys.path.insert(0, os.path.dirname(_here))

# Python 3.11 refuses a dataclass field whose default is an unhashable dataclass instance, which
# torch 1.13's _shard package has (pytorch#91795); DDP's tests import it. Such a default becomes a
# default_factory that copies it, which is what later torch releases wrote.
_get_field = dataclasses._get_field


def _lenient_get_field(cls, name, type_, *args):
    d = cls.__dict__.get(name, dataclasses.MISSING)
    default = d.default if isinstance(d, dataclasses.Field) else d
    if (default is not dataclasses.MISSING and dataclasses.is_dataclass(default)
            and not isinstance(default, type) and type(default).__hash__ is None):
        factory = lambda v=default: copy.deepcopy(v)  # noqa: E731
        if isinstance(d, dataclasses.Field):
            d.default, d.default_factory = dataclasses.MISSING, factory
        else:
            setattr(cls, name, dataclasses.field(default_factory=factory))
    return _get_field(cls, name, type_, *args)


dataclasses._get_field = _lenient_get_field

os.environ.setdefault("BACKEND", "collx")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", "/tmp")

import collx_torch  # noqa: E402,F401  registers "collx" (and in every spawned process, which imports this module)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

for feature in ("plugin", "ddp", "subgroup"):
    DistTestCases.backend_feature[feature].add(os.environ["BACKEND"])

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


# How each test's processes start: "spawn" (a fresh interpreter per rank, as PyTorch's CI runs
# this suite) or "fork" (a copy of this process, torch already imported: ~3x less time per test on
# 2 cores; the parent never creates a process group or runs an op, so nothing it holds is in use).
START = os.environ.get("COLLX_TORCH_TESTS_START", "spawn")


class TestCollxBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if START == "fork":
            import torch.multiprocessing
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


def main():
    global START
    import argparse
    import json
    p = argparse.ArgumentParser()
    p.add_argument("-k", action="append", default=[], help="run only tests whose name contains this (repeatable)")
    p.add_argument("--list", action="store_true", help="list the tests and exit")
    p.add_argument("--exclude", action="append", default=[], help="leave out tests whose name contains this")
    p.add_argument("--record", default="", help="write which tests ran and which were skipped, with torch's reasons, to this JSON file")
    p.add_argument("--applicable", default="", help="run only the tests that ran in the full run recorded in this JSON file "
                   "(at this WORLD_SIZE); list the others with the reasons recorded")
    p.add_argument("--start", choices=("spawn", "fork"), default=START,
                   help="how each test's processes start (default: spawn, or COLLX_TORCH_TESTS_START)")
    a = p.parse_args()
    START = a.start
    ws = os.environ["WORLD_SIZE"]
    loader = unittest.TestLoader()
    every = [n for n in loader.getTestCaseNames(TestCollxBackend) if not a.k or any(k in n for k in a.k)]
    names = [n for n in every if not any(x in n for x in a.exclude)]
    excluded = [n for n in every if n not in names]
    recorded_skips = {}
    if a.applicable:
        with open(a.applicable) as f:
            rec = json.load(f)[ws]
        recorded_skips = {n: r for n, r in rec["skipped"].items() if n in names}
        unknown = [n for n in names if n not in rec["ran"] and n not in rec["skipped"]]
        names = [n for n in names if n in rec["ran"] or n in unknown]  # a test the record does not know runs
    if a.list:
        print("\n".join(names))
        return 0
    suite = unittest.TestSuite(TestCollxBackend(n) for n in names)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    skipped = {t.id().split(".")[-1]: r for t, r in result.skipped}
    print(f"\n== skipped at WORLD_SIZE={ws}, with torch's reasons ({len(skipped)}):")
    for n, r in sorted(skipped.items()):
        print(f"  {n}: {r}")
    if excluded:
        print(f"== left out by --exclude ({len(excluded)}): " + ", ".join(excluded))
    if recorded_skips:
        print(f"== not run: skipped in the recorded full run ({a.applicable}) at WORLD_SIZE={ws} ({len(recorded_skips)}):")
        for n, r in sorted(recorded_skips.items()):
            print(f"  {n}: {r}")
    ran = result.testsRun - len(skipped)
    print(f"== WORLD_SIZE={ws}: {result.testsRun} tests: {ran} ran, {len(skipped)} skipped, "
          f"{len(result.failures)} failed, {len(result.errors)} errors")
    if a.record:
        bad = {t.id().split(".")[-1] for t, _ in result.failures + result.errors}
        data = {}
        if os.path.exists(a.record):
            with open(a.record) as f:
                data = json.load(f)
        data[ws] = {"ran": sorted(set(names) - set(skipped)), "skipped": skipped, "failed": sorted(bad)}
        with open(a.record, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
