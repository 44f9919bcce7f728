#!/usr/bin/env bash
# compare.sh: collx side by side with the library a user would otherwise pick, in one run, as
# ratios (docs/design.md, "How it is measured": these machines are shared and noisy).
#   BASELINE=mpi  (bench/compare_mpi.sh):  collx-perf --transport shm  vs Open MPI on shared memory
#   BASELINE=gloo (bench/compare_gloo.sh): collx-perf --transport tcp  vs Gloo over TCP (127.0.0.1)
#
#   bench/compare.sh [--markdown FILE]
#
# For N in $NS, for each collective in $COLLS, over sizes $MINB .. $MAXB (x$FACTOR), it runs
#   collx-perf --transport shm|tcp -np N --algo automatic   (all_reduce: --algo all, so ring, tree,
#                                                            recursive_halving and automatic all run)
#   mpirun -np N mpi-perf                                    (bench/mpi_perf.cpp), or
#   gloo-perf -np N                                          (bench/gloo_perf.cpp; all_reduce: Gloo's
#                                                            ring, ring_chunked and halving_doubling)
# (the baselines have collx-perf's flags, columns and conventions: bench/baseline.hpp),
# alternating the two for every collective, size band and repetition (the order flips every other
# repetition), $REPS times, and prints one table per (collective, N): the median over repetitions
# of time and busbw for each, and collx/baseline ratios (busbw: > 1 means collx is faster; time,
# shown for sizes < 64 KiB where latency dominates: < 1 means collx is faster). For all_reduce the
# table also has the best collx policy per size (lowest median time) and automatic's time over the
# best policy's ('!' past 1.10); where the baseline has several algorithms (Gloo's all-reduce) its
# best one per size is the one compared.
#
# Environment (defaults in brackets):
#   BASELINE [mpi]  mpi or gloo.
#   BUILD      where collx-perf is and the baseline driver goes [<repo>/build/bench]. collx-perf must be
#              built: cmake -S . -B build -DCOLLX_BUILD_TESTS=OFF && cmake --build build -j1 --target collx-perf
#              mpi-perf / gloo-perf are (re)built here (mpicxx -O3 / g++ -O3 -lgloo) when missing or
#              older than their source (or by CMake: targets mpi-perf, gloo-perf).
#   REPS [3]   repetitions.   NS ["2 4"] rank counts.   COLLS [all five; gloo: no reduce_scatter] collectives.
#   MINB [8] MAXB [256M; gloo 64M] FACTOR [4]   the size sweep (K/M/G suffixes).
#   Iterations per size band (so large sizes stay cheap; the default mpi run, REPS=3, takes ~5 min on
#   an idle 2-core machine, well under 15):
#     size < 64 KiB:        ITERS_SMALL [1000; gloo 200]  WARM_SMALL [50; gloo 10]
#     64 KiB .. 16 MiB:     ITERS_MID   [50; gloo 10]     WARM_MID   [5; gloo 2]
#     size > 16 MiB:        ITERS_LARGE [5; gloo 3]       WARM_LARGE [2; gloo 1]
#   TIMEOUT [600; gloo 120]  seconds per invocation; a run past it is killed and reported as a hang.
#   LOGDIR [$BUILD/compare_<baseline>_logs]  raw outputs of every run (and data.txt, the parsed rows).
#
# Open MPI settings: --mca pml ob1 --mca btl vader,self (shared memory only; ob1 so the btl list is
# honoured even where the UCX pml is installed). vader uses CMA (process_vm_readv, single copy) by
# default here (btl_vader_single_copy_mechanism = cma; check with
# `ompi_info --param btl vader --level 9`).
# --oversubscribe (4 ranks on 2 cores), --bind-to core (core:overload-allowed when the ranks
# outnumber the cores: rank r on core r mod cores, as collx's launch_processes binds).
# As root, mpirun needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (set below).
# Gloo: Debian's libgloo-dev, TCP transport on 127.0.0.1, file-store rendezvous, ranks forked by
# gloo-perf (unpinned, as torch.distributed starts them).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

markdown=""
while (($#)); do
  case "$1" in
    --markdown) [[ $# -ge 2 ]] || { echo "compare.sh: --markdown needs a FILE" >&2; exit 2; }
                markdown=$2; shift 2 ;;
    --markdown=*) markdown=${1#--markdown=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare.sh: unknown argument '$1' (--markdown FILE, or -h)" >&2; exit 2 ;;
  esac
done

BASELINE=${BASELINE:-mpi}
[[ $BASELINE == mpi || $BASELINE == gloo ]] || { echo "compare.sh: BASELINE must be mpi or gloo" >&2; exit 2; }
g=$([[ $BASELINE == gloo ]] && echo 1 || true)
BUILD=${BUILD:-$root/build/bench}
REPS=${REPS:-3}
NS=${NS:-"2 4"}
COLLS=${COLLS:-$([[ $g ]] && echo "all_reduce all_gather broadcast all_to_all" || echo "all_reduce reduce_scatter all_gather broadcast all_to_all")}
MINB=${MINB:-8} MAXB=${MAXB:-$([[ $g ]] && echo 64M || echo 256M)} FACTOR=${FACTOR:-4}
ITERS_SMALL=${ITERS_SMALL:-$([[ $g ]] && echo 200 || echo 1000)} WARM_SMALL=${WARM_SMALL:-$([[ $g ]] && echo 10 || echo 50)}
ITERS_MID=${ITERS_MID:-$([[ $g ]] && echo 10 || echo 50)} WARM_MID=${WARM_MID:-$([[ $g ]] && echo 2 || echo 5)}
ITERS_LARGE=${ITERS_LARGE:-$([[ $g ]] && echo 3 || echo 5)} WARM_LARGE=${WARM_LARGE:-$([[ $g ]] && echo 1 || echo 2)}
TIMEOUT=${TIMEOUT:-$([[ $g ]] && echo 120 || echo 600)}
LOGDIR=${LOGDIR:-$BUILD/compare_${BASELINE}_logs}
collx_transport=$([[ $g ]] && echo tcp || echo shm)
BASE_LABEL=$([[ $g ]] && echo Gloo || echo MPI)

collx=$BUILD/collx-perf
base=$BUILD/$BASELINE-perf
src=$here/${BASELINE}_perf.cpp

if [[ ! -x $collx ]]; then
  echo "compare.sh: $collx not found. Build it first, e.g." >&2
  echo "  cmake -S $root -B $root/build -DCOLLX_BUILD_TESTS=OFF -DCOLLX_BUILD_EXAMPLES=OFF" >&2
  echo "  cmake --build $root/build -j1 --target collx-perf" >&2
  echo "or point BUILD at the directory that holds collx-perf (BUILD=/path/to/build/bench)." >&2
  exit 2
fi
if [[ ! -x $base || $src -nt $base || $here/baseline.hpp -nt $base ]]; then
  mkdir -p "$BUILD"
  if [[ $g ]]; then
    [[ -f /usr/include/gloo/allreduce_ring.h ]] || { echo "compare.sh: Gloo not found (Debian: libgloo-dev)" >&2; exit 2; }
    echo "compare.sh: building $base (g++ -O3 -lgloo)" >&2
    g++ -std=c++20 -O3 -I"$root/include" -o "$base" "$src" -lgloo -pthread
  else
    command -v mpicxx >/dev/null || { echo "compare.sh: mpicxx not found (Debian: libopenmpi-dev)" >&2; exit 2; }
    echo "compare.sh: building $base (mpicxx -O3)" >&2
    mpicxx -std=c++20 -O3 -I"$root/include" -o "$base" "$src"
  fi
fi
[[ $g ]] || command -v mpirun >/dev/null || { echo "compare.sh: mpirun not found (Debian: openmpi-bin)" >&2; exit 2; }
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpirun_flags=(--oversubscribe --map-by core --mca pml ob1 --mca btl vader,self)

to_bytes() {  # 8, 64K, 32M, 1G -> bytes
  local s=$1 n mul=1
  n=${s%%[kKmMgGbB]*}
  case "${s#"$n"}" in
    "" | [bB]) ;;
    [kK]*) mul=1024 ;;
    [mM]*) mul=$((1024 * 1024)) ;;
    [gG]*) mul=$((1024 * 1024 * 1024)) ;;
    *) echo "compare.sh: bad size '$s'" >&2; exit 2 ;;
  esac
  [[ $n =~ ^[0-9]+$ ]] || { echo "compare.sh: bad size '$s'" >&2; exit 2; }
  echo $((n * mul))
}
minb=$(to_bytes "$MINB") maxb=$(to_bytes "$MAXB")
((FACTOR >= 2)) || { echo "compare.sh: FACTOR must be >= 2" >&2; exit 2; }

band_of() {  # the iteration band of a size
  if (($1 < 64 * 1024)); then echo small
  elif (($1 > 16 * 1024 * 1024)); then echo large
  else echo mid; fi
}
# Consecutive sizes of one band become one invocation: "lo hi iters warmup" per line.
bands=()
lo="" prev="" pband=""
s=$minb
while ((s <= maxb)); do
  b=$(band_of "$s")
  if [[ $b != "$pband" && -n $pband ]]; then bands+=("$lo $prev $pband"); lo=""; fi
  [[ -z $lo ]] && lo=$s
  prev=$s pband=$b
  if ((s == 0)); then s=1; else s=$((s * FACTOR)); fi
done
[[ -n $pband ]] && bands+=("$lo $prev $pband")
((${#bands[@]})) || { echo "compare.sh: empty size sweep ($MINB .. $MAXB)" >&2; exit 2; }
iters_of() {
  case $1 in
    small) echo "$ITERS_SMALL $WARM_SMALL" ;;
    mid) echo "$ITERS_MID $WARM_MID" ;;
    large) echo "$ITERS_LARGE $WARM_LARGE" ;;
  esac
}

mkdir -p "$LOGDIR"
data=$LOGDIR/data.txt
fails=$LOGDIR/failures.txt
: >"$data"
: >"$fails"

# run TOOL N COLL REP LO HI BAND: one invocation; its rows go to data.txt as
#   tool N coll rep algo size time busbw wrong
run_one() {
  local tool=$1 n=$2 coll=$3 rep=$4 lo=$5 hi=$6 band=$7 iters warm algo log rc=0
  read -r iters warm < <(iters_of "$band")
  local common=(-b "$lo" -e "$hi" -f "$FACTOR" -n "$iters" -w "$warm" --op "$coll")
  log=$LOGDIR/$tool-np$n-$coll-$band-rep$rep.txt
  local cmd
  if [[ $tool == collx ]]; then
    algo=automatic
    [[ $coll == all_reduce ]] && algo=all
    cmd=("$collx" --transport "$collx_transport" -np "$n" --algo "$algo" "${common[@]}")
  elif [[ $g ]]; then
    cmd=("$base" -np "$n" "${common[@]}")
  else
    # Ranks bound to cores round robin, as launch_processes binds them: one per core when they
    # fit (mpirun's default), else several per core (binding helps Open MPI as much as collx when
    # oversubscribed: 4 ranks on 2 cores, alltoall 256 KiB 38-53 us bound vs 41-62 unbound).
    bind=core
    ((n > $(nproc))) && bind=core:overload-allowed
    cmd=(mpirun -np "$n" --bind-to "$bind" "${mpirun_flags[@]}" "$base" "${common[@]}")
  fi
  local t0=$SECONDS
  timeout -k 10 "$TIMEOUT" "${cmd[@]}" >"$log" 2>&1 || rc=$?
  printf '  %-5s np=%d %-14s %-5s rep %d: %3ds rc=%d\n' "$tool" "$n" "$coll" "$band" "$rep" $((SECONDS - t0)) "$rc" >&2
  awk -v tool="$tool" -v n="$n" -v coll="$coll" -v rep="$rep" \
    '!/^#/ && NF >= 10 && $1 ~ /^[0-9]+$/ { print tool, n, coll, rep, $10, $1, $6, $8, $9 }' "$log" >>"$data"
  if ((rc != 0)); then
    local why="exit status $rc"
    ((rc == 124 || rc == 137)) && why="killed after ${TIMEOUT}s (hang?)"
    ((rc == 1)) && why="wrong results (#wrong > 0)"
    {
      echo "$tool np=$n $coll sizes $lo..$hi rep $rep: $why"
      echo "  command: ${cmd[*]}"
      echo "  last output lines:"
      { grep -m 4 -E '(collx-perf|mpi-perf|gloo-perf).*:|FAILED|[Ee]rror|[Aa]bort|[Tt]imeout|signal' "$log" || tail -n 4 "$log"; } | sed 's/^/    /'
    } >>"$fails"
  fi
}

started=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
t_start=$SECONDS
echo "compare.sh: NS='$NS' REPS=$REPS sizes $minb..$maxb x$FACTOR, bands: ${bands[*]/%/;}" >&2
for n in $NS; do
  for coll in $COLLS; do
    for ((rep = 1; rep <= REPS; ++rep)); do
      for band in "${bands[@]}"; do
        read -r lo hi bname <<<"$band"
        if ((rep % 2)); then
          run_one collx "$n" "$coll" "$rep" "$lo" "$hi" "$bname"
          run_one base "$n" "$coll" "$rep" "$lo" "$hi" "$bname"
        else
          run_one base "$n" "$coll" "$rep" "$lo" "$hi" "$bname"
          run_one collx "$n" "$coll" "$rep" "$lo" "$hi" "$bname"
        fi
      done
    done
  done
done
# Gloo: the yardstick of one plain TCP stream on loopback, measured in the same run (REPS times).
stream=""
if [[ $g && -x $BUILD/tcp-stream ]]; then
  vals=()
  for ((rep = 1; rep <= REPS; ++rep)); do vals+=("$("$BUILD/tcp-stream" -s 64M -n 10 | tail -n 1 | awk '{print $1}')"); done
  stream=$(printf '%s\n' "${vals[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  stream="One plain TCP stream on 127.0.0.1 (bench/tcp_stream.cpp, 64 MiB messages from memory, one process per core), measured in this run: median ${stream} GB/s (runs: ${vals[*]})."
fi
elapsed=$((SECONDS - t_start))

# ---- tables -----------------------------------------------------------------------------------
# table FORMAT COLL N: FORMAT is text or md.
table() {
  awk -v fmt="$1" -v coll="$2" -v n="$3" -v BL="$BASE_LABEL" '
    function median(list,   a, k, i, j, t) {
      k = split(list, a, " ")
      if (k == 0) return ""
      for (i = 2; i <= k; ++i) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; --j) a[j + 1] = a[j]; a[j + 1] = t }
      return (k % 2) ? a[(k + 1) / 2] + 0 : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    function ftime(us) { return us == "" ? "-" : (us >= 10000 ? sprintf("%.0f", us) : us >= 100 ? sprintf("%.1f", us) : sprintf("%.2f", us)) }
    function fbw(b) { return b == "" ? "-" : sprintf("%.2f", b) }
    function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "-" : sprintf("%.2f", a / b) }
    # busbw from the median time (the rows print busbw to 0.01 GB/s only, too coarse for small sizes);
    # so the busbw ratio collx/MPI is the time ratio MPI/collx, the size and factor being the same.
    function bw(b, us) { return us == "" ? "" : (us > 0 ? b / us / 1e3 * factor : 0) }
    function hsize(b) {
      if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) "M"
      if (b >= 1024 && b % 1024 == 0) return (b / 1024) "K"
      return b
    }
    $2 == n && $3 == coll {
      tool = ($1 == "base") ? "base:" $5 : $5
      if ($1 == "base") bpol[$5] = 1
      key = tool SUBSEP $6
      T[key] = T[key] " " $7
      if ($9 != "0" && $9 != "N/A") W[key] = 1
      if (!($6 in seen)) { seen[$6] = 1; sizes[++ns] = $6 + 0 }
      if ($1 == "collx" && $5 != "automatic") pol[$5] = 1
    }
    END {
      factor = coll == "all_reduce" ? 2 * (n - 1) / n : coll == "broadcast" ? 1 : (n - 1) / n
      if (ns == 0) { print (fmt == "md" ? "_no rows (see failures)_\n" : "  (no rows: see failures)\n"); exit }
      for (i = 2; i <= ns; ++i) { t = sizes[i]; for (j = i - 1; j >= 1 && sizes[j] > t; --j) sizes[j + 1] = sizes[j]; sizes[j + 1] = t }
      best = (coll == "all_reduce")
      hdr[1] = "size"; hdr[2] = "collx t(us)"; hdr[3] = "collx busbw"
      nc = 3
      if (best) { hdr[++nc] = "best algo"; hdr[++nc] = "best busbw" }
      nb = 0; for (p in bpol) ++nb
      if (nb > 1) hdr[++nc] = BL " algo"
      hdr[++nc] = BL " t(us)"; hdr[++nc] = BL " busbw"; hdr[++nc] = "busbw collx/" BL
      if (best) hdr[++nc] = "busbw best/" BL
      if (best) hdr[++nc] = "automatic/best policy"
      hdr[++nc] = "time collx/" BL
      for (r = 1; r <= ns; ++r) {
        s = sizes[r]; c = 0
        at = median(T["automatic" SUBSEP s])
        mt = ""; mn = ""
        for (p in bpol) { v = median(T["base:" p SUBSEP s]); if (v != "" && (mt == "" || v < mt)) { mt = v; mn = p } }
        ab = bw(s, at); mb = bw(s, mt)
        cell[r, ++c] = hsize(s)
        cell[r, ++c] = ftime(at) (W["automatic" SUBSEP s] ? "!" : "")
        cell[r, ++c] = fbw(ab)
        if (best) {
          bn = ""; bt = ""
          for (p in pol) { v = median(T[p SUBSEP s]); if (v != "" && (bt == "" || v < bt)) { bt = v; bn = p } }
          bp = bt  # the best of the policies, automatic aside
          if (at != "" && (bt == "" || at <= bt)) { bt = at; bn = "automatic" }
          cell[r, ++c] = (bn == "" ? "-" : bn) (W[bn SUBSEP s] ? "!" : "")
          cell[r, ++c] = fbw(bw(s, bt))
        }
        if (nb > 1) cell[r, ++c] = mn == "" ? "-" : mn
        cell[r, ++c] = ftime(mt) (W["base:" mn SUBSEP s] ? "!" : "")
        cell[r, ++c] = fbw(mb)
        cell[r, ++c] = s > 0 ? ratio(mt, at) : "-"
        if (best) cell[r, ++c] = s > 0 ? ratio(mt, bt) : "-"
        if (best) cell[r, ++c] = ratio(at, bp) ((at != "" && bp != "" && at > 1.1 * bp) ? " !" : "")
        cell[r, ++c] = (s < 65536) ? ratio(at, mt) : ""
      }
      if (fmt == "md") {
        line = "|"; sep = "|"
        for (c = 1; c <= nc; ++c) { line = line " " hdr[c] " |"; sep = sep (c == 1 || hdr[c] ~ /algo$/ ? " --- |" : " ---: |") }
        print line; print sep
        for (r = 1; r <= ns; ++r) { line = "|"; for (c = 1; c <= nc; ++c) line = line " " cell[r, c] " |"; print line }
        print ""
      } else {
        for (c = 1; c <= nc; ++c) { wd[c] = length(hdr[c]); for (r = 1; r <= ns; ++r) if (length(cell[r, c]) > wd[c]) wd[c] = length(cell[r, c]) }
        line = " "; for (c = 1; c <= nc; ++c) line = line sprintf(" %" wd[c] "s", hdr[c]); print line
        for (r = 1; r <= ns; ++r) { line = " "; for (c = 1; c <= nc; ++c) line = line sprintf(" %" wd[c] "s", cell[r, c]); print line }
        print ""
      }
    }' "$data"
}

if [[ $g ]]; then
  legend="collx: collx-perf --transport tcp --algo automatic (127.0.0.1); Gloo: Debian's libgloo $(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null || echo '?') over TCP on 127.0.0.1 (bench/gloo_perf.cpp; all-reduce: best of ring, ring_chunked, halving_doubling per size, in place). Median of $REPS rep(s) each; time in us, busbw in GB/s (nccl-tests' convention). busbw collx/Gloo > 1: collx faster. time collx/Gloo (sizes < 64K, latency-bound) < 1: collx faster. '!' marks a median cell with #wrong > 0 in some rep; '-' a size with no row (failure, hang or past TIMEOUT)."
  title="collx tcp vs Gloo"
else
  legend="collx: collx-perf --transport shm --algo automatic; MPI: Open MPI $(mpirun --version 2>/dev/null | awk 'NR==1{print $NF}') (pml ob1, btl vader,self; CMA single copy). Median of $REPS rep(s) each; time in us, busbw in GB/s (nccl-tests' convention). busbw collx/MPI > 1: collx faster. time collx/MPI (sizes < 64K, latency-bound) < 1: collx faster. '!' marks a median cell with #wrong > 0 in some rep; '-' a size with no row (failure or hang)."
  title="collx shared memory vs Open MPI"
fi
describe="$(nproc) cores, $(uname -srm), started $started, ${elapsed}s; REPS=$REPS, sizes $minb..$maxb x$FACTOR; iters/warm-up: <64K $ITERS_SMALL/$WARM_SMALL, 64K..16M $ITERS_MID/$WARM_MID, >16M $ITERS_LARGE/$WARM_LARGE"
rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$root" status --porcelain -- include bench 2>/dev/null | grep -q . && echo " (with uncommitted changes)" || true)

echo "# $title: $describe; collx $rev$dirty"
echo "# $legend"
[[ -n $stream ]] && echo "# $stream"
for n in $NS; do
  for coll in $COLLS; do
    echo "## $coll  np=$n"
    table text "$coll" "$n"
  done
done
if [[ -s $fails ]]; then
  echo "## failures"
  sed 's/^/  /' "$fails"
fi
echo "# raw outputs: $LOGDIR"

if [[ -n $markdown ]]; then
  {
    echo "# $title"
    echo
    echo "Generated by \`bench/compare_$BASELINE.sh\`: $describe; collx at \`$rev\`$dirty."
    echo
    echo "$legend"
    echo
    if [[ -n $stream ]]; then echo "$stream"; echo; fi
    for n in $NS; do
      for coll in $COLLS; do
        echo "## $coll, $n ranks"
        echo
        table md "$coll" "$n"
      done
    done
    if [[ -s $fails ]]; then
      echo "## Failures"
      echo
      echo '```'
      cat "$fails"
      echo '```'
    fi
  } >"$markdown"
  echo "# markdown: $markdown"
fi
# Non-zero when some run failed, hung or gave wrong results (the tables are printed regardless).
[[ ! -s $fails ]]
