#!/usr/bin/env bash
# compare_commits.sh: collx-perf built at two commits, run alternately on one machine, as ratios:
# so a change checks itself against what it changes (docs/performance.md, issue 34's targets).
#
#   bench/compare_commits.sh A B        e.g. bench/compare_commits.sh 987e05e HEAD
#
# Builds collx-perf at each commit (a git worktree under $WORK, Release, tests and examples off;
# kept between runs, rebuilt only when missing), then for every point of the sweep below runs A
# and B in turn, the order flipping every repetition, $REPS times, and prints per point the median
# time (us) of each, B/A (< 1: B is faster), and the median busbw of each. A point is
#   transport x N x collective x size      (collx-perf --algo $ALGO -b size -e size)
#
# Environment (defaults in brackets):
#   WORK [<repo>/build-compare]     worktrees and builds (ignored by git).
#   REPS [5]                        repetitions (medians over them).
#   TRANSPORTS ["shm threads"]      NS ["2 4"]      ALGO [automatic]
#   COLLS ["all_reduce broadcast all_gather reduce_scatter"]
#   SIZES ["8 128 2K 64K 8M"]       ITERS [1000, 100 from 64K, 10 from 8M]   WARM [ITERS/10]
#   JOBS [2]                        build parallelism.
set -euo pipefail

[[ $# -eq 2 ]] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${WORK:-$root/build-compare}
REPS=${REPS:-5}
TRANSPORTS=${TRANSPORTS:-"shm threads"}
NS=${NS:-"2 4"}
ALGO=${ALGO:-automatic}
COLLS=${COLLS:-"all_reduce broadcast all_gather reduce_scatter"}
SIZES=${SIZES:-"8 128 2K 64K 8M"}
JOBS=${JOBS:-2}

build() {  # commit -> path of its collx-perf
  local sha dir
  sha=$(git -C "$root" rev-parse --short "$1^{commit}")
  dir=$WORK/$sha
  if [[ ! -x $dir/build/bench/collx-perf ]]; then
    [[ -d $dir/src ]] || git -C "$root" worktree add --detach "$dir/src" "$sha" >&2
    cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DCOLLX_BUILD_TESTS=OFF \
      -DCOLLX_BUILD_EXAMPLES=OFF -DCOLLX_CUDA=OFF >&2
    cmake --build "$dir/build" -j "$JOBS" --target collx-perf >&2
  fi
  echo "$dir/build/bench/collx-perf"
}

bytes() {
  local s=$1
  case $s in
    *K) echo $((${s%K} * 1024)) ;;
    *M) echo $((${s%M} * 1024 * 1024)) ;;
    *) echo "$s" ;;
  esac
}

a=$(build "$1")
b=$(build "$2")
echo "# A = $1 ($a)"
echo "# B = $2 ($b)"
echo "# $REPS alternating runs per point; medians; B/A < 1: B faster"
printf '%-8s %2s %-15s %8s %12s %12s %7s %11s %11s\n' transport N collective size "A us" "B us" "B/A" "A busbw" "B busbw"

run() {  # binary transport n coll size -> "time busbw"
  local it warm
  local by
  by=$(bytes "$5")
  if ((by >= 8 * 1024 * 1024)); then it=10; elif ((by >= 64 * 1024)); then it=100; else it=1000; fi
  it=${ITERS:-$it}
  warm=${WARM:-$((it / 10 > 0 ? it / 10 : 1))}
  "$1" --transport "$2" -np "$3" --op "$4" --algo "$ALGO" -b "$by" -e "$by" -n "$it" -w "$warm" 2>/dev/null |
    awk '!/^#/ && NF >= 8 && !done { print $6, $8; done = 1 }' || true
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for t in $TRANSPORTS; do
  for n in $NS; do
    for c in $COLLS; do
      for s in $SIZES; do
        ta=() tb=() ba=() bb=()
        for ((i = 0; i < REPS; i++)); do
          if ((i % 2 == 0)); then ra=$(run "$a" "$t" "$n" "$c" "$s"); rb=$(run "$b" "$t" "$n" "$c" "$s")
          else rb=$(run "$b" "$t" "$n" "$c" "$s"); ra=$(run "$a" "$t" "$n" "$c" "$s"); fi
          [[ -n $ra ]] || { echo "compare_commits.sh: A gave no row ($t -np $n $c $s)" >&2; ra="nan nan"; }
          [[ -n $rb ]] || { echo "compare_commits.sh: B gave no row ($t -np $n $c $s)" >&2; rb="nan nan"; }
          ta+=("${ra% *}") ba+=("${ra#* }") tb+=("${rb% *}") bb+=("${rb#* }")
        done
        mta=$(printf '%s\n' "${ta[@]}" | median) mtb=$(printf '%s\n' "${tb[@]}" | median)
        mba=$(printf '%s\n' "${ba[@]}" | median) mbb=$(printf '%s\n' "${bb[@]}" | median)
        ratio=$(awk -v x="$mta" -v y="$mtb" 'BEGIN { if (x > 0) printf "%.3f", y / x; else print "nan" }')
        printf '%-8s %2d %-15s %8s %12s %12s %7s %11s %11s\n' "$t" "$n" "$c" "$s" "$mta" "$mtb" "$ratio" "$mba" "$mbb"
      done
    done
  done
done
