#!/usr/bin/env bash
# Starts N ranks of a program as plain background processes with torchrun's variables, as a
# torchrun or a job script would, and fails unless every rank succeeds.
#   torchrun_style.sh PROGRAM N [ARGS...]
set -u
prog=$1 n=$2
shift 2
port=$((20000 + $$ % 20000))
pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$prog" "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
