#!/usr/bin/env bash
# collx: the two commands.
#   ./run.sh demo   builds collx-perf and runs real collectives on 8 ranks, every policy: as
#                   threads, then as processes over shared memory, then over TCP (127.0.0.1)
#   ./run.sh test   builds and runs the whole test suite: a g++ release build of everything but the
#                   Catch2 suite (with the CUDA parts where nvcc is: every kernel compiled for sm_90,
#                   the PTX checked; their GPU tests skip without a GPU: tests/gpu/run.sh
#                   runs them on one), then the whole suite under AddressSanitizer+UBSan,
#                   then ThreadSanitizer (the threaded-transport subset), then the libFuzzer
#                   targets (tcp's wire format and rendezvous store) for a bounded time each,
#                   then the torch backend (python/collx_torch): its build, its own tests in real
#                   processes (torch's own components against gloo among them), DDP over
#                   torchrun against gloo, and PyTorch's DistributedTest at world sizes 2 and 3
#                   (the tests of the recorded full run; ranks forked)
#   ./run.sh torch-tests [WORLD_SIZE...]   PyTorch's own DistributedTest suite against the
#                   collx backend, every test, ranks spawned as PyTorch's CI does, recording
#                   what ran (default: world sizes 2 and 3; ~30 min each on 2 cores)
# On a fresh Debian 12 machine, run as root: missing Debian packages are installed first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

need() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "run.sh: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "run.sh: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

jobs=$(nproc)
started=$SECONDS
stage() {  # a stage's heading, with the time since run.sh started (CI's budget is read off these)
  local t=$((SECONDS - started))
  printf '== [%d:%02d] %s\n' $((t / 60)) $((t % 60)) "$*"
}
base_pkgs=(cmake g++ ninja-build make libssl-dev)

configure() {  # configure <dir> [cmake args...]
  local dir=$1; shift
  cmake -S . -B "$dir" -G Ninja -Wno-dev "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
}

# The torch backend's extension, built with torch.utils.cpp_extension into build-torch/ (Debian's
# python3, whatever python comes first on PATH).
build_torch() {
  stage "the torch backend: building its extension (build-torch/)"
  PYTHONPATH=python /usr/bin/python3 -c 'import collx_torch'   # the README's command
}

torch_backend_tests() {
  build_torch
  stage "the torch backend: every collective, dtype and op against torch's arithmetic; groups; faults; the GIL; torch's own components against gloo"
  /usr/bin/python3 python/tests/test_collx_torch.py
  # (2 and 3 ranks, ZeroRedundancyOptimizer included, run in test_collx_torch's components case)
  stage "the torch backend: DDP under torchrun at 4 ranks, gloo and collx, same data: losses step by step"
  /usr/bin/python3 python/examples/compare_ddp.py --np 4 --model mlp exact --steps 8 --quiet
  stage "the torch backend: DDP with COLLX_DETERMINISTIC=1 at 2 and 3 ranks: the same parameter bits across bucket layouts and runs"
  /usr/bin/python3 python/tests/ddp_deterministic.py --np 2 3 --steps 20
  # PyTorch's own suite: the tests that ran in the full run recorded in torch_tests_record.json
  # (./run.sh torch-tests runs all of them and rewrites it); the others are listed with the
  # reasons torch gave.
  for w in 2 3; do
    stage "PyTorch's DistributedTest against collx, WORLD_SIZE=$w: the tests that apply to a CPU plugin backend"
    WORLD_SIZE=$w /usr/bin/python3 python/tests/torch_distributed_tests.py --start fork \
      --applicable python/tests/torch_tests_record.json
  done
}

case "${1:-}" in
  demo)
    need "${base_pkgs[@]}"
    configure build-demo -DCMAKE_BUILD_TYPE=Release -DCOLLX_BUILD_TESTS=OFF -DCOLLX_BUILD_EXAMPLES=OFF
    cmake --build build-demo -j "$jobs" --target collx-perf collx-explain
    # what each policy does and costs, and the one algo::automatic picks (the cost model)
    ./build-demo/tools/collx-explain all_reduce -n 8 --bytes 64MiB --transport threads --steps 0
    ./build-demo/bench/collx-perf --demo                    # ranks as threads
    ./build-demo/bench/collx-perf --demo --transport shm    # ranks as processes over shared memory
    ./build-demo/bench/collx-perf --demo --transport tcp    # ranks as processes over TCP sockets
    ;;
  test)
    need "${base_pkgs[@]}" catch2 libbenchmark-dev openmpi-bin libopenmpi-dev openssh-client clang libclang-rt-14-dev iproute2 libeigen3-dev \
      python3-torch libtorch-dev pybind11-dev mpich libmpich-dev slurmctld slurmd slurm-client munge
    # The Catch2 suite runs once, in the sanitizer builds below (clang builds it ~3.5x faster than
    # g++); the release build checks everything else with g++ at the flags users build with:
    # the strategy programs and examples run as tests, the benchmarks, tools, CUDA kernels and
    # PTX, the compile-fail and install tests. (Building and running the suite here as well was
    # ~7 of the 55 min CI took at 6da25ec.)
    stage "release build (g++): examples, benchmarks, tools, CUDA, compile-fail and install tests"
    # CUDA for sm_90 alone (the H100/H200 tests/gpu/run.sh runs on): the kernels have no path of
    # their own per architecture, and compiling each for sm_80 as well was ~2.5 min of CPU
    # (a user's build keeps CMake's default here, 80 and 90).
    # Nothing compiled from CUDA runs here (no GPU; tests/gpu/run.sh builds its own, optimised),
    # so its host code is compiled unoptimised: test_cuda.cu took 66 s at -O3 and 42 s at -O0.
    configure build -DCMAKE_BUILD_TYPE=Release -DCOLLX_BUILD_SUITE=OFF -DCMAKE_CUDA_ARCHITECTURES=90 \
      "-DCMAKE_CUDA_FLAGS_RELEASE=-O0 -Xcompiler -O0 -DNDEBUG"
    cmake --build build -j "$jobs"
    ctest --test-dir build -j "$jobs" --output-on-failure
    stage "AddressSanitizer + UndefinedBehaviorSanitizer: the whole suite"
    # The sanitizer builds use clang: on these headers it compiles a sanitized test ~3.5x faster
    # than g++ (the whole ASan build: ~8 min instead of ~25 on 2 cores), and the release build
    # above covers g++ on the examples, benchmarks and tools.
    # -O1 with line tables only (the sanitizers' documented setting): a report still names file
    # and line, and the ASan build took 12.1 min instead of 13.5 at -O2 -g.
    # The CUDA parts are built and checked by the release build alone (their tests need a GPU).
    san_flags=(-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" -DCOLLX_CUDA=OFF)
    configure build-asan "${san_flags[@]}" -DCOLLX_SANITIZE=address,undefined \
      -DCOLLX_BUILD_BENCH=OFF -DCOLLX_BUILD_EXAMPLES=OFF
    cmake --build build-asan -j "$jobs"
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan -j "$jobs" --output-on-failure
    stage "ThreadSanitizer: the thread transport's tests"
    configure build-tsan "${san_flags[@]}" -DCOLLX_SANITIZE=thread \
      -DCOLLX_BUILD_BENCH=OFF -DCOLLX_BUILD_EXAMPLES=OFF -DCOLLX_BUILD_TOOLS=OFF
    cmake --build build-tsan -j "$jobs"
    TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan -j "$jobs" --output-on-failure
    stage "libFuzzer: tcp's wire format and rendezvous store, ${COLLX_FUZZ_SECONDS:-15} s each"
    configure build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCOLLX_FUZZ=ON -DCOLLX_FUZZ_SECONDS="${COLLX_FUZZ_SECONDS:-15}"
    cmake --build build-fuzz -j "$jobs"
    ctest --test-dir build-fuzz -j "$jobs" --output-on-failure
    torch_backend_tests
    stage "every stage passed"
    ;;
  torch-tests)
    need "${base_pkgs[@]}" python3-torch libtorch-dev pybind11-dev
    shift
    sizes=("$@")
    [ ${#sizes[@]} -eq 0 ] && sizes=(2 3)
    build_torch
    for w in "${sizes[@]}"; do
      stage "PyTorch's DistributedTest against collx, WORLD_SIZE=$w"
      WORLD_SIZE=$w /usr/bin/python3 python/tests/torch_distributed_tests.py --record python/tests/torch_tests_record.json
    done
    ;;
  *)
    echo "usage: ./run.sh demo | test | torch-tests [WORLD_SIZE...]" >&2
    exit 2
    ;;
esac
