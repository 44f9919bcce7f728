#!/usr/bin/env bash
# ring_vs_tree.sh: the plots and tables of docs/ring-vs-tree.md, from collx's own tools:
#   predicted  collx-explain C -n N --transport T --policy ring,tree --csv 8 64M   (the cost
#              model, with this machine's calibration for T and N, or the shipped defaults)
#   measured   collx-perf --transport T -np N --op C --algo P, for P in ring, tree (medians of
#              $REPS runs)
# For each case it writes docs/plots/<case>.png (busbw against size, one colour per policy,
# predicted dashed, measured solid, the model's crossovers as vertical lines) and
# docs/plots/<case>.dat (the numbers), and prints a markdown table per case.
#
#   docs/plots/ring_vs_tree.sh            (needs gnuplot: apt-get install gnuplot-nox)
#
# Environment: BUILD [<repo>/build] (collx-explain in tools/, collx-perf in bench/), REPS [3],
#   CASES ["all_reduce:threads:8 broadcast:threads:8 all_reduce:tcp:4"], MAXB [64M],
#   POLICIES [ring,tree], PLOT_ONLY [unset] (1: no measuring; the plots and tables from the
#   .dat files already here).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
BUILD=${BUILD:-$root/build}
REPS=${REPS:-3}
CASES=${CASES:-"all_reduce:threads:8 broadcast:threads:8 all_reduce:tcp:4"}
MAXB=${MAXB:-64M}
POLICIES=${POLICIES:-ring,tree}
explain=$BUILD/tools/collx-explain
perf=$BUILD/bench/collx-perf
for x in "$explain" "$perf"; do [[ -x $x ]] || { echo "ring_vs_tree.sh: $x is not built" >&2; exit 2; }; done
command -v gnuplot > /dev/null || { echo "ring_vs_tree.sh: needs gnuplot (apt-get install gnuplot-nox)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for case in $CASES; do
  IFS=: read -r coll transport n <<< "$case"
  name=${coll}_${transport}_n${n}
  # Predicted: bytes,policy,predicted_us,busbw_GBps,best
  "$explain" "$coll" -n "$n" --transport "$transport" --policy "$POLICIES" --csv 8 "$MAXB" > "$tmp/pred.csv"
  "$explain" "$coll" -n "$n" --transport "$transport" --policy "$POLICIES" --steps 0 > "$tmp/explain.txt"
  # Measured: size ... busbw #wrong algo, three size bands so that large sizes stay cheap.
  : > "$tmp/meas.txt"
  [[ ${PLOT_ONLY:-} ]] || for ((rep = 1; rep <= REPS; ++rep)); do
    for band in "8 32K 300" "128K 2M 20" "8M $MAXB 3"; do
      read -r lo hi it <<< "$band"
      for p in ${POLICIES//,/ }; do
        "$perf" --transport "$transport" -np "$n" --op "$coll" --algo "$p" -b "$lo" -e "$hi" -f 4 -n "$it" -w 2 -c 0 2>/dev/null |
          awk '!/^#/ && NF >= 10 {print $1, $10, $6}' >> "$tmp/meas.txt"
      done
    done
    echo "  $case rep $rep" >&2
  done
  policies=$(awk -F, 'NR > 1 {print $2}' "$tmp/pred.csv" | awk '!seen[$0]++' | tr '\n' ' ')
  # nccl-tests' bus bandwidth factor.
  case $coll in all_reduce) factor=$(echo "2*($n-1)/$n" | bc -l) ;; broadcast|reduce) factor=1 ;; *) factor=$(echo "($n-1)/$n" | bc -l) ;; esac
  # One row per size: size, then per policy predicted and measured (median) busbw (GB/s) and
  # time (us).
  [[ ${PLOT_ONLY:-} ]] || awk -v pols="$policies" -v factor="$factor" '
    function median(s,   n, i, j, t, a) {
      n = split(s, a, " ")
      for (i = 2; i <= n; ++i) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; --j) a[j + 1] = a[j]; a[j + 1] = t }
      return n ? a[int((n + 1) / 2)] : "NaN"
    }
    FNR == 1 { file++ }
    file == 1 && FNR > 1 { split($0, f, ","); pred[f[1], f[2]] = f[4]; predt[f[1], f[2]] = f[3]; sizes[f[1]] = 1 }
    file == 2 { meas[$1, $2] = meas[$1, $2] " " $3 }
    END {
      np = split(pols, P, " ")
      printf "# size"; for (i = 1; i <= np; ++i) printf " busbw_pred_%s busbw_meas_%s us_pred_%s us_meas_%s", P[i], P[i], P[i], P[i]; printf "\n"
      for (s in sizes) order[++m] = s + 0
      for (i = 1; i <= m; ++i) for (j = i + 1; j <= m; ++j) if (order[j] < order[i]) { t = order[i]; order[i] = order[j]; order[j] = t }
      for (k = 1; k <= m; ++k) {
        s = order[k]; printf "%d", s
        for (i = 1; i <= np; ++i) {
          t = ((s, P[i]) in meas) ? median(meas[s, P[i]]) : "-"
          printf " %s %s %s %s", pred[s, P[i]], (t == "-" || t + 0 <= 0) ? "-" : sprintf("%.6g", s / t / 1e3 * factor), predt[s, P[i]], t
        }
        printf "\n"
      }
    }' FS=' ' "$tmp/pred.csv" "$tmp/meas.txt" > "$here/$name.dat"
  # The model's crossovers: "from X below Y policy" lines of collx-explain's summary.
  xs=$(awk '/the best (policy|of these) by size/ {on = 1; next} on && /^ +from/ {print $2 $3}' "$tmp/explain.txt" | tail -n +2 |
       sed 's/KiB/*1024/; s/MiB/*1048576/; s/GiB/*1073741824/; s/B$//' | bc 2>/dev/null | tr '\n' ' ' || true)
  {
    echo "set terminal pngcairo noenhanced size 900,560 font ',10'"
    echo "set datafile missing '-'"
    echo "set output '$here/$name.png'"
    echo "set title '$coll, $n ranks over $transport: predicted (dashed) and measured (solid) busbw'"
    echo "set logscale x 2; set logscale y 10; set format x '%.0b%B'; set format y '%g'; set xlabel 'size (bytes)'; set ylabel 'busbw (GB/s)'"
    echo "set key left top; set grid"
    i=0
    for x in $xs; do i=$((i + 1)); echo "set arrow $i from $x, graph 0 to $x, graph 1 nohead dt 3 lc rgb 'gray40'"; done
    printf "plot "
    col=2 c=1 sep=""
    for p in $policies; do
      printf "%s'%s' using 1:%d with lines dt 2 lw 2 lc %d title '%s predicted', '' using 1:%d with linespoints lw 2 pt 7 ps 0.7 lc %d title '%s measured'" \
        "$sep" "$here/$name.dat" $col $c "$p" $((col + 1)) $c "$p"
      sep=", "; col=$((col + 4)); c=$((c + 1))
    done
    echo
  } > "$tmp/plot.gp"
  gnuplot "$tmp/plot.gp"
  # The markdown table: per size, the measured best, the model's pick, and each policy's busbw.
  echo
  echo "### $coll, $n ranks over $transport"
  echo
  sed -n '/^== the cost model/,$p' "$tmp/explain.txt" | sed -n '/alpha .* s\/step/p; /from: /p; /measured with/p' |
    sed "s/^ */    /; s|${HOME:-/nonexistent}|~|g"
  echo
  printf '| size (B) |'; for p in $policies; do printf ' %s predicted (us) | %s measured (us) |' "$p" "$p"; done; echo ' measured best | model'"'"'s best |'
  printf '| ---: |'; for p in $policies; do printf ' ---: | ---: |'; done; echo ' --- | --- |'
  awk -v pols="$policies" -v pred="$tmp/pred.csv" '
    BEGIN { np = split(pols, P, " "); while ((getline l < pred) > 0) { split(l, f, ","); if (f[5] == "1") pick[f[1]] = f[2] } }
    /^#/ { next }
    { any = 0; for (i = 1; i <= np; ++i) if ($(4 * i + 1) != "-") any = 1
      if (!any) next
      printf "| %s |", $1; best = ""; bb = -1
      for (i = 1; i <= np; ++i) { printf " %.1f | %s |", $(4 * i), ($(4 * i + 1) == "-" ? "-" : sprintf("%.1f", $(4 * i + 1)))
        if ($(4 * i + 1) != "-" && (bb < 0 || $(4 * i + 1) + 0 < bb)) { bb = $(4 * i + 1) + 0; best = P[i] } }
      printf " %s | %s |\n", best, pick[$1] }' "$here/$name.dat"
  echo
  echo "![$coll, $n ranks over $transport](plots/$name.png)"
done
