#!/usr/bin/env bash
# automatic.sh: how far algo::automatic's choice is from the best policy, size by size, on every
# transport (issue 5's target: within 10%, or the table says where not and why).
#
#   bench/automatic.sh [--markdown FILE]
#
# For each transport:ranks case in $CASES, each collective in $COLLS and each size $MINB..$MAXB
# (x$FACTOR), it runs `collx-perf --algo all` (every policy that has the collective, then
# automatic, in one run) $REPS times, and prints per size the median time of each policy, the
# best of them, the policy the model picked (collx-perf's "#a" lines: what automatic ran, unless
# COLLX_ALGO is set), and two ratios:
#   pick/best  the median time of the model's pick, in its own rows, over the best median: the
#              quality of the choice, free of the automatic rows' own noise;
#   auto/best  the automatic rows' median over the best median (the same choice plus noise).
# The model's parameters are this machine's calibration (collx-perf --calibrate) or the shipped
# defaults; the header says which.
#
# Environment (defaults in brackets):
#   BUILD [<repo>/build/bench]  where collx-perf is.   REPS [3]   LOGDIR [$BUILD/automatic_logs]
#   CASES ["threads:8 shm:2 shm:4 tcp:2 tcp:4"]   COLLS ["all_reduce reduce_scatter all_gather broadcast reduce"]
#   MINB [8] MAXB [64M] FACTOR [8]
#   iterations: < 64 KiB 500 (warm-up 20), .. 4 MiB 30 (5), larger 5 (2); -c 0 (no check: the
#   test suite checks results; this measures).
#   REPORT_ONLY=1: no runs; the report from the last run's $LOGDIR.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
markdown=""
while (($#)); do
  case "$1" in
    --markdown) [[ $# -ge 2 ]] || { echo "automatic.sh: --markdown needs a FILE" >&2; exit 2; }
                markdown=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "automatic.sh: unknown argument '$1' (--markdown FILE, or -h)" >&2; exit 2 ;;
  esac
done

BUILD=${BUILD:-$root/build/bench}
REPS=${REPS:-3}
CASES=${CASES:-"threads:8 shm:2 shm:4 tcp:2 tcp:4"}
COLLS=${COLLS:-"all_reduce reduce_scatter all_gather broadcast reduce"}
MINB=${MINB:-8} MAXB=${MAXB:-64M} FACTOR=${FACTOR:-8}
LOGDIR=${LOGDIR:-$BUILD/automatic_logs}
perf=$BUILD/collx-perf
[[ -x $perf ]] || { echo "automatic.sh: $perf is not built (cmake --build build --target collx-perf)" >&2; exit 2; }

bytes() {  # 64M -> 67108864
  local v=$1 m=1
  case $v in *K) m=1024; v=${v%K} ;; *M) m=$((1 << 20)); v=${v%M} ;; *G) m=$((1 << 30)); v=${v%G} ;; esac
  echo $((v * m))
}
minb=$(bytes "$MINB") maxb=$(bytes "$MAXB")
mkdir -p "$LOGDIR"
data=$LOGDIR/data.txt
start=$(date +%s)
[[ ${REPORT_ONLY:-} ]] || : > "$data"

[[ ${REPORT_ONLY:-} ]] || for c in $CASES; do
  t=${c%%:*} n=${c##*:}
  for coll in $COLLS; do
    for ((rep = 1; rep <= REPS; ++rep)); do
      for ((s = minb; s <= maxb; s *= FACTOR)); do
        if ((s < 65536)); then it=500 w=20; elif ((s <= 4194304)); then it=30 w=5; else it=5 w=2; fi
        log=$LOGDIR/$t-$n-$coll-$s-$rep.txt
        if ! timeout 600 "$perf" --transport "$t" -np "$n" --op "$coll" --algo all -b "$s" -e "$s" -n $it -w $w -c 0 > "$log" 2>&1; then
          echo "  $t -np $n $coll $s rep $rep: failed (see $log)" >&2
          continue
        fi
        # data rows: size count type redop root time algbw busbw #wrong algo
        awk -v c="$t:$n" -v coll="$coll" '!/^#/ && NF >= 10 {print "row", c, coll, $1, $10, $6}
             /^#a/ && $2 ~ /^[0-9]+$/ {print "pick", c, coll, $2, $5}' "$log" >> "$data"
      done
      printf '  %-8s -np %-2s %-15s rep %d done (%ds)\n' "$t" "$n" "$coll" "$rep" $(($(date +%s) - start)) >&2
    done
  done
done

# The model's parameters per case (the home directory shown as ~).
params=$(for c in $CASES; do t=${c%%:*} n=${c##*:}; awk '/^# model:/ {print; exit}' "$LOGDIR/$t-$n-"*.txt 2>/dev/null |
         sed "s|^# model:|$t -np $n:|; s|${HOME:-/nonexistent}|~|g"; done || true)
report() {
  awk -v fmt="$1" '
    function median(key,   n, i, j, t, a) {
      n = split(vals[key], a, " ")
      for (i = 2; i <= n; ++i) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; --j) a[j + 1] = a[j]; a[j + 1] = t }
      return n ? a[int((n + 1) / 2)] : -1
    }
    $1 == "row"  { k = $2 SUBSEP $3 SUBSEP $4; vals[k SUBSEP $5] = vals[k SUBSEP $5] " " $6; algos[k] = algos[k] " " $5
                   if (!(k in seen)) { seen[k] = 1; order[++nk] = k } }
    $1 == "pick" { pick[$2 SUBSEP $3 SUBSEP $4] = $5 }
    END {
      last = ""
      for (i = 1; i <= nk; ++i) {
        k = order[i]; split(k, f, SUBSEP)
        head = f[1] " " f[2]
        if (head != last) {
          if (last != "") summary(last)
          last = head; within = 0; sizes = 0; misses = ""
          split(f[1], tn, ":")
          if (fmt == "md") { printf "\n## %s, %s over %s ranks\n\n| size | best | best t(us) | model'"'"'s pick | pick t(us) | pick/best | automatic t(us) | auto/best |\n| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |\n", f[2], tn[1], tn[2] }
          else printf "\n# %s, %s over %s ranks\n%12s  %-18s %10s  %-18s %10s %9s %12s %9s\n", f[2], tn[1], tn[2], "size", "best", "best(us)", "pick", "pick(us)", "pick/best", "auto(us)", "auto/best"
        }
        best = ""; bt = 0; delete done
        n = split(algos[k], al, " ")
        for (j = 1; j <= n; ++j) {
          a = al[j]; if (a in done) continue; done[a] = 1
          if (a == "automatic") continue
          m = median(k SUBSEP a) + 0
          if (best == "" || m < bt) { best = a; bt = m }
        }
        p = (k in pick) ? pick[k] : "?"
        pt = (p != "?" && (k SUBSEP p) in vals) ? median(k SUBSEP p) + 0 : -1
        at = ((k SUBSEP "automatic") in vals) ? median(k SUBSEP "automatic") + 0 : -1
        pr = (pt > 0 && bt > 0) ? pt / bt : -1
        ar = (at > 0 && bt > 0) ? at / bt : -1
        sizes++; if (pr >= 0 && pr <= 1.10) within++; else misses = misses " " f[3]
        if (fmt == "md") printf "| %s | %s | %.2f | %s | %.2f | %.2f%s | %.2f | %.2f |\n", f[3], best, bt, p, pt, pr, (pr > 1.10 ? " !" : ""), at, ar
        else printf "%12s  %-18s %10.2f  %-18s %10.2f %9.2f %12.2f %9.2f%s\n", f[3], best, bt, p, pt, pr, at, ar, (pr > 1.10 ? "  > 10%" : "")
      }
      if (last != "") summary(last)
    }
    function summary(h) {
      if (fmt == "md") printf "\nThe model'"'"'s pick within 10%% of the best at %d of %d sizes%s.\n", within, sizes, misses == "" ? "" : " (not at:" misses ")"
      else printf "# the model'"'"'s pick within 10%% of the best at %d of %d sizes%s\n", within, sizes, misses == "" ? "" : " (not at:" misses ")"
    }' "$data"
}

echo "# automatic.sh: REPS=$REPS, sizes $MINB..$MAXB x$FACTOR, $(($(date +%s) - start)) s"
echo "$params" | sed 's/^/# /'
report text
if [[ -n $markdown ]]; then
  {
    echo "# algo::automatic against the best policy"
    echo
    echo "Generated by \`bench/automatic.sh\`: $(nproc) cores, $(uname -srm), $(date -u '+%Y-%m-%d %H:%M UTC'), $(($(date +%s) - start)) s;"
    echo "REPS=$REPS (medians), sizes $MINB..$MAXB x$FACTOR; collx at \`$(git -C "$root" rev-parse --short HEAD)\`$(git -C "$root" diff --quiet HEAD -- include bench || echo ' (with uncommitted changes)')."
    echo
    echo "Model parameters (collx-perf's header of the runs):"
    echo
    echo "$params" | sed 's/^/    /'
    echo
    echo "pick/best: the median time of the policy the model picked, in its own rows, over the best policy's median (the quality of the choice). auto/best: the automatic rows' median over the best (the same choice plus run-to-run noise). '!' marks a pick more than 10% slower than the best."
    report md
  } > "$markdown"
  echo "wrote $markdown" >&2
fi
