#!/usr/bin/env python3
"""collx's layers, read from the real #includes under include/collx.

Each folder of include/collx is one floor; a header may include headers of its own floor or of
floors below it, never above. The floors, bottom up, are FLOORS below (the one list of them).

    tools/layers.py check                 fails (exit 1) on an upward include, naming both files,
                                          and on a header in a folder that is on no floor
    tools/layers.py draw                  prints the picture docs/design.md shows
    tools/layers.py draw --update FILE    writes it into FILE, between the markers
    tools/layers.py check --doc FILE      also fails when FILE's picture (between the markers
                                          <!-- layers --> and <!-- /layers -->) is not the one
                                          draw prints now: the picture cannot drift

The suite runs `check --doc docs/design.md` (tests/CMakeLists.txt, test "layers").
"""
import os
import re
import sys

# Bottom up: (folder, what it holds). "" is include/collx itself (the umbrella header).
FLOORS = [
    ("core", "errors, settings, deadlines, wire types, schedules, delivery, waits, signatures"),
    ("ops", "the reduction functors and how a chunk is reduced"),
    ("algo", "the policies, each its schedule and cost; the cost model; automatic"),
    ("device", "device plans: a schedule lowered for a kernel to walk; their memory"),
    ("transport", "inproc, shm, tcp, mpi, and decorators (counting, any, planned)"),
    ("comm", "the communicator: call order, progress thread, schedule cache, flight recorder"),
    ("collectives", "the executor (a schedule run on a transport) and every collective"),
    ("features", "groups (split, mesh, shrink), async and fused calls, buckets, device IPC"),
    ("launch", "ranks as threads, ranks as processes"),
    ("cuda", "the CUDA transport, its kernels, device memory between processes (nvcc)"),
    ("", "collx.hpp (everything above); notices for headers that moved"),
]

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
INC = os.path.join(ROOT, "include", "collx")
INCLUDE = re.compile(r'^\s*#\s*include\s+(?:"([^"]+)"|<(collx/[^>]+)>)', re.M)


def floor_of(rel):
    top = rel.split("/", 1)[0] if "/" in rel else ""
    for i, (name, _) in enumerate(FLOORS):
        if name == top:
            return i
    return None


def headers():
    out = []
    for d, _, files in os.walk(INC):
        for f in files:
            if f.endswith((".hpp", ".cuh", ".h")):
                out.append(os.path.relpath(os.path.join(d, f), INC).replace(os.sep, "/"))
    return sorted(out)


def edges(unresolved=None):
    """(from, to) for every include of a collx header (quoted, relative to the including file or
    to include/, or <collx/...>), both relative to include/collx. An include of neither kind that
    names no file goes to `unresolved` (a check problem: an include the check cannot place)."""
    out = []
    for h in headers():
        text = open(os.path.join(INC, h), encoding="utf-8").read()
        for m in INCLUDE.finditer(text):
            if m.group(2):
                cands = [m.group(2)[len("collx/"):]]
            else:
                cands = [os.path.join(os.path.dirname(h), m.group(1)), m.group(1)[len("collx/"):] if m.group(1).startswith("collx/") else None]
            found = None
            for c in cands:
                if c is None:
                    continue
                t = os.path.normpath(c).replace(os.sep, "/")
                if os.path.exists(os.path.join(INC, t)):
                    found = t
                    break
            if found:
                out.append((h, found))
            elif unresolved is not None and (m.group(2) or not os.path.isabs(m.group(1))):
                unresolved.append(f"include/collx/{h}: #include {m.group(0).split('include', 1)[1].strip()} names no header of collx")
    return out


def problems():
    bad = []
    for h in headers():
        if floor_of(h) is None:
            bad.append(f"include/collx/{h}: its folder is on no floor (add it to FLOORS in tools/layers.py)")
    unresolved = []
    es = edges(unresolved)
    bad += unresolved
    for a, b in es:
        fa, fb = floor_of(a), floor_of(b)
        if fa is None or fb is None:
            continue
        if fb > fa:
            bad.append(f"include/collx/{a} (floor {FLOORS[fa][0] or 'top'}) includes include/collx/{b} "
                       f"(floor {FLOORS[fb][0] or 'top'}, above it)")
    return bad


def draw():
    hs = headers()
    es = edges()
    lines = []
    for i in reversed(range(len(FLOORS))):
        name, what = FLOORS[i]
        mine = [h for h in hs if floor_of(h) == i]
        down = {}
        for a, b in es:
            if floor_of(a) == i and floor_of(b) != i:
                k = FLOORS[floor_of(b)][0] or "top"
                down[k] = down.get(k, 0) + 1
        label = (name + "/") if name else "collx.hpp"
        lines.append(f"{i:2d} {label:<13}{len(mine):3d}  {what}")
        if down:
            order = [f for f, _ in FLOORS]
            uses = ", ".join(f"{k} {down[k]}" for k in sorted(down, key=lambda k: -order.index(k if k != 'top' else '')))
            lines.append(f"{'':<18}uses {uses}")
    return "\n".join(lines) + "\n"


def doc_picture(path):
    text = open(path, encoding="utf-8").read()
    m = re.search(r"<!-- layers -->\n```\n(.*?)```\n<!-- /layers -->", text, re.S)
    return m.group(1) if m else None


def main(argv):
    if len(argv) >= 2 and argv[1] == "draw":
        if "--update" in argv:
            doc = argv[argv.index("--update") + 1]
            text = open(doc, encoding="utf-8").read()
            new, n = re.subn(r"(<!-- layers -->\n```\n).*?(```\n<!-- /layers -->)",
                             lambda m: m.group(1) + draw() + m.group(2), text, flags=re.S)
            if n != 1:
                print(f"{doc}: no picture between <!-- layers --> and <!-- /layers -->")
                return 1
            open(doc, "w", encoding="utf-8").write(new)
            return 0
        sys.stdout.write(draw())
        return 0
    if len(argv) >= 2 and argv[1] == "check":
        bad = problems()
        if "--doc" in argv:
            doc = argv[argv.index("--doc") + 1]
            pic = doc_picture(doc)
            if pic is None:
                bad.append(f"{doc}: no picture between <!-- layers --> and <!-- /layers -->")
            elif pic != draw():
                bad.append(f"{doc}: its picture of the layers is not the includes' any more; "
                           f"run tools/layers.py draw --update {doc}")
        for b in bad:
            print(b)
        n = len(edges())
        print(f"layers: {len(headers())} headers, {n} includes, {len(bad)} problem(s)")
        return 1 if bad else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
