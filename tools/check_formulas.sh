#!/usr/bin/env bash
# Every formula line collx-explain prints beside a schedule must hold: for each collective, policy,
# N = 2..16, commutative or not, at a small size and (all_reduce) at sizes that run in segments,
# no "(differs)". Usage: check_formulas.sh path/to/collx-explain
set -uo pipefail
explain=$1
bad=0
for c in all_reduce reduce_scatter all_gather broadcast reduce all_to_all; do
  sizes="64KiB"
  [ "$c" = all_reduce ] && sizes="64KiB 17MiB 16388KiB 64MiB"  # 16 MiB + 4 KiB: a short last segment
  for b in $sizes; do
    for n in $(seq 2 16); do
      for nc in "" --noncommutative; do
        [ -n "$nc" ] && [ "$c" != all_reduce ] && [ "$c" != reduce_scatter ] && [ "$c" != reduce ] && continue
        roots="0"
        [ "$c" = broadcast ] || [ "$c" = reduce ] && roots="0 $((n - 1))"
        for root in $roots; do
          out=$("$explain" "$c" -n "$n" --bytes "$b" --root "$root" $nc --steps 0 2>&1) || { echo "FAILED: $c -n $n --bytes $b --root $root $nc"; bad=1; continue; }
          if ! grep -q "(matches" <<<"$out"; then
            echo "NO FORMULA LINE: $c -n $n --bytes $b --root $root $nc"
            bad=1
          fi
          if grep -q "(differs)" <<<"$out"; then
            echo "DIFFERS: $c -n $n --bytes $b --root $root $nc"
            grep -E "^== |\(differs\)" <<<"$out" | grep -B1 "(differs)"
            bad=1
          fi
        done
      done
    done
  done
done
[ $bad -eq 0 ] && echo "every formula line holds"
exit $bad
