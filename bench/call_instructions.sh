#!/usr/bin/env bash
# call_instructions.sh: the instructions one collx call costs in bookkeeping, at each commit given,
# counted by callgrind (valgrind), so the figure does not move with the machine's load.
#
#   bench/call_instructions.sh COMMIT...        e.g. bench/call_instructions.sh 987e05e HEAD
#
# For each commit: bench/call_cost.cpp (this checkout's) built with g++ -O3 against that commit's
# include/ (git archive into $WORK/<sha>), run under `valgrind --tool=callgrind` at 1000 and at
# 21000 calls of each kind; (instructions(21000) - instructions(1000)) / 40000 is one call's: an
# 8 B all_reduce (ring) and an 8 B broadcast (tree) on one thread-rank, averaged. Needs valgrind
# (Debian: valgrind).
set -euo pipefail
[[ $# -ge 1 ]] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${WORK:-$root/build-compare/call-instructions}
command -v valgrind >/dev/null || { echo "call_instructions.sh: valgrind not found (Debian: valgrind)" >&2; exit 2; }
mkdir -p "$WORK"
count() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$1" "$2" 2>&1 | awk '/Collected/ {print $4}'; }
printf '%-10s %s\n' commit "instructions a call"
for c in "$@"; do
  sha=$(git -C "$root" rev-parse --short "$c^{commit}")
  dir=$WORK/$sha
  if [[ ! -x $dir/call_cost ]]; then
    rm -rf "$dir/include" && mkdir -p "$dir"
    git -C "$root" archive "$sha" include | tar -x -C "$dir"
    g++ -std=c++20 -O3 -DNDEBUG -I"$dir/include" -o "$dir/call_cost" "$root/bench/call_cost.cpp" -pthread
  fi
  a=$(count "$dir/call_cost" 1000)
  b=$(count "$dir/call_cost" 21000)
  printf '%-10s %d\n' "$sha" $(((b - a) / 40000))
done
