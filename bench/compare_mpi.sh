#!/usr/bin/env bash
# Side by side with Open MPI on shared memory: see bench/compare.sh (BASELINE=mpi) for what it runs and its settings.
exec env BASELINE=mpi "$(dirname "${BASH_SOURCE[0]}")/compare.sh" "$@"
