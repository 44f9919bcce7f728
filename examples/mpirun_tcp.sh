#!/usr/bin/env bash
# Runs PROGRAM tcp under `mpirun -np N`, with the rendezvous address passed to every rank the
# way an MPI user would (-x MASTER_ADDR -x MASTER_PORT).
#   mpirun_tcp.sh MPIRUN PROGRAM N
set -eu
mpirun=$1 prog=$2 n=$3
port=$((20000 + $$ % 20000))
exec "$mpirun" --oversubscribe -np "$n" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port "$prog" tcp
