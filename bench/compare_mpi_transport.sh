#!/usr/bin/env bash
# compare_mpi_transport.sh: collx's collectives over transport::mpi against MPI's own, side by side
# in the same processes over the same MPI path (docs/mpi.md, "Against MPI's own collectives").
#
#   bench/compare_mpi_transport.sh [build dir (build)]
#
# For each path (Open MPI's ob1 over vader, over tcp), N, collective and repetition it runs
# `mpirun ... mpi-perf` (MPI's collectives) and `mpirun ... mpi-perf --collx` (collx's) in turn,
# at 8 B (2000 calls) and at 1 MiB and 16 MiB (10 calls), and prints per point the median time of
# each and the ratios (time collx/MPI < 1: collx faster; busbw collx/MPI > 1: collx faster).
#
# Environment: REPS [5], NS ["2 4"], PATHS ["vader tcp"], COLLS ["all_reduce all_gather"],
# THREADS [single]: the level MPI is started with, for both (multiple: what collx::async needs;
# Open MPI then locks in every call, its own collectives' too).
# Run it on an idle machine: a waiting collx rank sleeps (it leaves its core to its peer), and
# beside a build it wakes late.
set -euo pipefail
build=${1:-build}
perf=$build/bench/mpi-perf
[[ -x $perf ]] || { echo "compare_mpi_transport.sh: $perf not built (cmake --build $build --target mpi-perf)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for rep in $(seq "${REPS:-5}"); do
  for path in ${PATHS:-vader tcp}; do
    for np in ${NS:-2 4}; do
      for op in ${COLLS:-all_reduce all_gather}; do
        for who in mpi collx; do
          flag=()
          [[ $who == collx ]] && flag=(--collx)
          run() {
            mpirun -np "$np" --oversubscribe --bind-to core:overload-allowed --mca pml ob1 --mca btl "self,$path" \
              "$perf" "${flag[@]}" --thread-level "${THREADS:-single}" --op "$op" "$@" 2>/dev/null | grep -v '^#' |
              awk -v p="$path" -v n="$np" -v o="$op" -v w="$who" 'NF >= 8 {print p, n, o, w, $1, $6, $8}' >> "$raw"
          }
          run -b 8 -e 8 -n 2000 -w 100
          run -b 1M -e 16M -f 16 -n 10 -w 3
        done
      done
    done
  done
done
python3 - "$raw" <<'EOF'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    path, n, op, who, size, us, bw = line.split()
    d[(path, int(n), op, int(size), who)].append((float(us), float(bw)))
print("| path | N | op | size | MPI (us) | collx over MPI (us) | time collx/MPI | busbw collx/MPI |")
print("|---|---|---|---|---|---|---|---|")
for k in sorted({k[:4] for k in d}):
    a, b = d.get(k + ("mpi",)), d.get(k + ("collx",))
    if not a or not b:
        continue
    ua, ub = statistics.median(x[0] for x in a), statistics.median(x[0] for x in b)
    ba, bb = statistics.median(x[1] for x in a), statistics.median(x[1] for x in b)
    size = k[3]
    s = f"{size} B" if size < 1024 else (f"{size >> 10} KiB" if size < 1 << 20 else f"{size >> 20} MiB")
    print(f"| ob1 over {k[0]} | {k[1]} | {k[2]} | {s} | {ua:.2f} | {ub:.2f} | {ub / ua:.2f} | {bb / ba if ba else 0:.2f} |")
EOF
