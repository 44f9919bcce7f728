#!/usr/bin/env bash
# The one GPU check, for a machine with one NVIDIA GPU (an H200 is what may be lent):
#   tests/gpu/run.sh OUTDIR
# builds the CUDA tests and benchmark (COLLX_GPU_ONLY: no Catch2 or other packages needed, every
# kernel for sm_80 and sm_90), runs test_cuda (every dtype x op against the host reference, every
# collective x policy at N = 1, 2, 4, 8 thread-ranks on device 0, splits, a fused batch,
# stream-ordered nonblocking calls, the errors), test_cuda_ipc (process-ranks, 2 and 3 processes
# mapped through VMM descriptors and through cudaIpc handles, buffers from cudaMalloc, VMM and a
# pool, every collective x policy, nonblocking calls, a split, a mismatch, a killed rank), then
# collx-perf --transport cuda (collx-perf-cuda: nccl-tests-style sweeps of all_reduce at N = 2
# and 8, every collective at N = 3, checked), then collx-cuda-bench (the reduction against
# cub::DeviceTransform, a device copy, the collectives of 1 GiB at N = 2, 4, 8, an 8 B
# all_reduce beside NCCL's one-rank call), and writes every log and summary.txt under OUTDIR.
# It ends in under 8 minutes: each step has its own time limit.
#
# (COLLX_GPU_BUILD_S overrides the build's limit of 130 s: on a 2-core machine without a GPU the build
# alone takes ~5 min, and the rest then skips, which is how the script itself is checked.)
set -uo pipefail
# A hang shows as an error naming the peer within the steps' limits; kernels load up front (a
# lazily loaded kernel may wait for the device, where other ranks' kernels wait for this rank).
# CUDA_DEVICE_MAX_CONNECTIONS: the device's hardware work queues (8 by default, 32 at most); more
# streams than queues share them in order, and a rank's kernel waiting on a peer whose work sits
# behind it in the same queue would wait until its deadline. At N = 8 thread-ranks a test
# process has ~16 streams (each rank's and the threads' own).
export COLLX_TIMEOUT_S=${COLLX_TIMEOUT_S:-10} CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
out=${1:?usage: tests/gpu/run.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # (the script moves to the repository's root below)
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
start=$SECONDS
say() { printf '== [%3d s] %s\n' $((SECONDS - start)) "$*" | tee -a "$out/summary.txt"; }
: >"$out/summary.txt"

say "the machine"
{ nvidia-smi || true; nvcc --version || true; } >"$out/machine.txt" 2>&1
grep -E "H200|H100|A100|Driver|release" "$out/machine.txt" | head -5 | tee -a "$out/summary.txt"

# NCCL: the toolkit's, else the nvidia-nccl wheel that PyTorch images carry.
nccl_root=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)

say "configure (build-gpu/)"
if ! cmake -S . -B build-gpu -G Ninja -Wno-dev -DCMAKE_BUILD_TYPE=Release -DCOLLX_GPU_ONLY=ON \
    ${nccl_root:+-DCOLLX_NCCL_ROOT="$nccl_root"} >"$out/configure.log" 2>&1; then
  tail -30 "$out/configure.log" | tee -a "$out/summary.txt"
  say "FAILED: configure"
  exit 1
fi
say "build"
if ! timeout "${COLLX_GPU_BUILD_S:-130}" cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1; then
  grep -E "error|FAILED" "$out/build.log" | head -30 | tee -a "$out/summary.txt"
  say "FAILED: build"
  exit 1
fi
say "no-GPU checks of the build (PTX, headers)"
(cd build-gpu && ctest -E "every dtype|process-ranks|collx-perf" --output-on-failure) >"$out/ctest.log" 2>&1
tail -3 "$out/ctest.log" | tee -a "$out/summary.txt"

say "test_cuda: dtype x op, collectives x policies at N = 1, 2, 4, 8, errors"
timeout 95 build-gpu/tests/cuda/test_cuda >"$out/test_cuda.txt" 2>&1
rc_test=$?
grep -E "^FAIL|checks|device 0|instances|collectives at|splits|fused|stream-ordered|timeout|mismatch|skipped" "$out/test_cuda.txt" | head -40 | tee -a "$out/summary.txt"
say "test_cuda exit status $rc_test (0 passed, 77 skipped: no device)"

say "test_cuda_ipc: process-ranks (VMM descriptors, cudaIpc handles), collectives x policies at N = 2, 3, errors"
timeout 75 build-gpu/tests/cuda/test_cuda_ipc >"$out/test_cuda_ipc.txt" 2>&1
rc_ipc=$?
grep -E "^FAIL|checks|process-ranks|collectives over|async|mismatch|killed|skipped" "$out/test_cuda_ipc.txt" | head -40 | tee -a "$out/summary.txt"
say "test_cuda_ipc exit status $rc_ipc (0 passed, 77 skipped: no device)"

say "collx-perf --transport cuda (collx-perf-cuda): sweeps on device buffers, checked"
perf=build-gpu/bench/collx-perf-cuda
rc_perf=0
{
  # (the check runs on the host: 1 GiB at N = 2, 256 MiB at N = 8)
  timeout 22 $perf --transport cuda -np 2 -b 8 -e 1G -f 8 -n 10 -w 2 --op all_reduce || rc_perf=$?
  timeout 22 $perf --transport cuda -np 8 -b 8 -e 256M -f 8 -n 10 -w 2 --op all_reduce || rc_perf=$?
  for op in reduce_scatter all_gather broadcast all_to_all; do
    timeout 6 $perf --transport cuda -np 3 -b 8 -e 64M -f 16 -n 5 -w 1 --op $op || rc_perf=$?
  done
} >"$out/perf.txt" 2>&1
grep -E "^# collx-perf|^ +[0-9]|Out of bounds|Avg bus|collx-perf --transport cuda:" "$out/perf.txt" | tee -a "$out/summary.txt"
say "collx-perf --transport cuda exit status $rc_perf"

say "collx-cuda-bench"
PATH_NCCL=${nccl_root:+$nccl_root/lib}
LD_LIBRARY_PATH=${PATH_NCCL}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 75 build-gpu/bench/cuda/collx-cuda-bench >"$out/bench.txt" 2>&1
rc_bench=$?
cat "$out/bench.txt" | tee -a "$out/summary.txt"
say "done: test_cuda $rc_test, test_cuda_ipc $rc_ipc, collx-perf $rc_perf, bench $rc_bench"
[ "$rc_test" -eq 0 ] && [ "$rc_ipc" -eq 0 ] && [ "$rc_perf" -eq 0 ] && [ "$rc_bench" -eq 0 ]
