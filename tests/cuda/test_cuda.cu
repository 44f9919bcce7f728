// The GPU tests: every element type x op of cuda/list.cuh against the host reference, then every
// collective x policy over cuda::transport with N = 1, 2, 4, 8 thread-ranks on one device
// against the serial reference, then the errors a kernel must report instead of hanging
// (mismatched sizes, a rank that never calls, a rank that fails). Without a CUDA device it says
// why and exits 77, which ctest counts as skipped.
//
//   test_cuda [--quick]      (--quick: N = 2 only, for a development loop)
#include <collx/features/async.hpp>
#include <collx/collx.hpp>
#include <collx/cuda/transport.cuh>

#include "expect.hpp"

#include <chrono>
#include <cstdio>
#include <memory>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "instances.cuh"

namespace {

using collx_gpu_test::checks;
using collx_gpu_test::expect;
using collx_gpu_test::failures;

/// Device memory for one rank's thread. Stream-ordered (cudaMallocAsync / cudaFreeAsync on the
/// thread's default stream): cudaMalloc and cudaFree may wait for the whole device, where the
/// other ranks' kernels may be waiting for this rank (NCCL's users meet the same with several
/// ranks in one process).
template <class E>
struct device_vec {
  E* p = nullptr;
  std::size_t n = 0;
  explicit device_vec(std::size_t count) : n(count) {
    collx::cuda::check(cudaMallocAsync(&p, std::max<std::size_t>(1, n) * sizeof(E), cudaStreamPerThread), "cudaMallocAsync");
    collx::cuda::check(cudaMemsetAsync(p, 0, std::max<std::size_t>(1, n) * sizeof(E), cudaStreamPerThread), "cudaMemsetAsync");
    collx::cuda::check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
  }
  device_vec(const std::vector<E>& h) : device_vec(h.size()) { put(h); }
  device_vec(const device_vec&) = delete;
  device_vec& operator=(const device_vec&) = delete;
  ~device_vec() { cudaFreeAsync(p, cudaStreamPerThread); }
  void put(const std::vector<E>& h) {
    collx::cuda::check(cudaMemcpyAsync(p, h.data(), h.size() * sizeof(E), cudaMemcpyHostToDevice, cudaStreamPerThread), "cudaMemcpyAsync");
    collx::cuda::check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
  }
  std::vector<E> get() const {
    std::vector<E> h(n);
    collx::cuda::check(cudaMemcpyAsync(h.data(), p, n * sizeof(E), cudaMemcpyDeviceToHost, cudaStreamPerThread), "cudaMemcpyAsync");
    collx::cuda::check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
    return h;
  }
  std::span<E> span() { return {p, n}; }
  std::span<const E> cspan() const { return {p, n}; }
};

std::int32_t val(int r, std::size_t i) { return std::int32_t((r + 1) * 1000003 + std::int64_t(i) * 7) % 100000; }

namespace al = collx::algo;
template <class A>
constexpr bool has_rs = std::is_same_v<A, al::automatic> || requires(const A& a, const al::rs_problem& p) { a.reduce_scatter(p); };
template <class A>
constexpr bool has_ar = has_rs<A> || requires(const A& a, const al::ar_problem& p) { a.all_reduce(p); };
template <class A>
constexpr bool has_ag = std::is_same_v<A, al::automatic> || requires(const A& a, const al::ag_problem& p) { a.all_gather(p); };
template <class A>
constexpr bool has_bcast = std::is_same_v<A, al::automatic> ||
                           (requires(const A& a, const al::bcast_problem& p) { a.broadcast(p); } &&
                            requires(const A& a, const al::reduce_problem& p) { a.reduce(p); });

/// The first rank's note, "rank r: what", or "" when every rank's is empty.
std::string first_note(const std::vector<std::string>& notes) {
  for (std::size_t r = 0; r < notes.size(); ++r)
    if (!notes[r].empty()) return "rank " + std::to_string(r) + ": " + notes[r];
  return {};
}

/// A deadline short enough that a hang shows as an error naming the peer well inside
/// tests/gpu/run.sh's limit for the whole test.
collx::options bounded() {
  collx::options o;
  o.timeout = std::chrono::seconds(10);
  return o;
}

/// Runs every collective of policy Algo on n ranks and counts, comparing with the host.
template <class Algo>
void collectives(int n, const char* pname) {
  for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(n > 1 ? n - 1 : 2), std::size_t(n + 1), std::size_t(100003),
                            (std::size_t(1) << 20) + 3}) {
    const std::string where = std::string(pname) + ", N=" + std::to_string(n) + ", count=" + std::to_string(count);
    std::vector<std::string> notes(static_cast<std::size_t>(n));
    try {
      collx::cuda::launch_threads(n, [&](auto& comm) {
        const int r = comm.rank();
        std::string& note = notes[std::size_t(r)];
        std::vector<std::int32_t> h(count);
        for (std::size_t i = 0; i < count; ++i) h[i] = val(r, i);
        // all_reduce (sum, in place)
        if constexpr (has_ar<Algo>) {
          device_vec<std::int32_t> d(h);
          collx::all_reduce(comm, d.span(), collx::ops::sum{}, Algo{});
          const auto got = d.get();
          for (std::size_t i = 0; i < count && note.empty(); ++i) {
            std::int32_t want = 0;
            for (int q = 0; q < n; ++q) want += val(q, i);
            if (got[i] != want) note = "all_reduce wrong at " + std::to_string(i);
          }
          // and out of place (collx-perf --transport cuda's call): the input stays as it was
          device_vec<std::int32_t> din(h), dout(std::vector<std::int32_t>(count, -1));
          collx::all_reduce(comm, din.cspan(), dout.span(), collx::ops::sum{}, Algo{});
          const auto out = dout.get(), kept = din.get();
          for (std::size_t i = 0; i < count && note.empty(); ++i) {
            std::int32_t want = 0;
            for (int q = 0; q < n; ++q) want += val(q, i);
            if (out[i] != want) note = "all_reduce (out of place) wrong at " + std::to_string(i);
            else if (kept[i] != h[i]) note = "all_reduce (out of place) changed its input at " + std::to_string(i);
          }
        }
        // reduce_scatter (max) and all_gather of blocks of k
        const std::size_t k = count / std::size_t(n) + (count % 2);
        if constexpr (has_rs<Algo>) {
          std::vector<std::int32_t> in(k * std::size_t(n));
          for (std::size_t i = 0; i < in.size(); ++i) in[i] = val(r, i);
          device_vec<std::int32_t> din(in), dout(k);
          collx::reduce_scatter(comm, din.cspan(), dout.span(), collx::ops::max{}, Algo{});
          const auto got = dout.get();
          for (std::size_t i = 0; i < k && note.empty(); ++i) {
            std::int32_t want = val(0, std::size_t(r) * k + i);
            for (int q = 1; q < n; ++q) want = std::max(want, val(q, std::size_t(r) * k + i));
            if (got[i] != want) note = "reduce_scatter wrong at " + std::to_string(i);
          }
        }
        if constexpr (has_ag<Algo>) {
          std::vector<std::int32_t> mine(k);
          for (std::size_t i = 0; i < k; ++i) mine[i] = val(r, i);
          device_vec<std::int32_t> dm(mine), dall(k * std::size_t(n));
          collx::all_gather(comm, dm.cspan(), dall.span(), Algo{});
          const auto all = dall.get();
          for (int q = 0; q < n && note.empty(); ++q)
            for (std::size_t i = 0; i < k; ++i)
              if (all[std::size_t(q) * k + i] != val(q, i)) {
                note = "all_gather wrong at block " + std::to_string(q);
                break;
              }
        }
        if constexpr (has_bcast<Algo>) {
          const int root = n - 1;
          device_vec<std::int32_t> d(h);
          collx::broadcast(comm, d.span(), root, Algo{});
          const auto got = d.get();
          for (std::size_t i = 0; i < count && note.empty(); ++i)
            if (got[i] != val(root, i)) note = "broadcast wrong at " + std::to_string(i);
          device_vec<std::int32_t> in(h), out(count);
          collx::reduce(comm, in.cspan(), out.span(), collx::ops::sum{}, root, Algo{});
          if (r == root) {
            const auto sum = out.get();
            for (std::size_t i = 0; i < count && note.empty(); ++i) {
              std::int32_t want = 0;
              for (int q = 0; q < n; ++q) want += val(q, i);
              if (sum[i] != want) note = "reduce wrong at " + std::to_string(i);
            }
          }
        }
        {  // (every rank calls it, whatever it found before: a rank that skipped it would hang the others)
          std::vector<std::int32_t> in(k * std::size_t(n));
          for (int q = 0; q < n; ++q)
            for (std::size_t i = 0; i < k; ++i) in[std::size_t(q) * k + i] = r * 1000 + q * 10 + std::int32_t(i % 7);
          device_vec<std::int32_t> din(in), dout(in.size());
          collx::all_to_all(comm, din.cspan(), dout.span());
          const auto got = dout.get();
          for (int q = 0; q < n && note.empty(); ++q)
            for (std::size_t i = 0; i < k; ++i)
              if (got[std::size_t(q) * k + i] != q * 1000 + r * 10 + std::int32_t(i % 7)) {
                note = "all_to_all wrong from " + std::to_string(q);
                break;
              }
        }
      }, bounded());
    } catch (const std::exception& e) {
      expect(false, where + ": " + e.what());
      continue;
    }
    const std::string first = first_note(notes);
    expect(first.empty(), where + ": " + first);
  }
}

template <class F>
std::string error_of(int n, F f, collx::options o = {}) {
  try {
    collx::cuda::launch_threads(n, f, o);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // run.sh may kill it at its limit: what it printed stays
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device here (cudaGetDeviceCount: %s, %d devices)\n",
                e == cudaSuccess ? "no error" : cudaGetErrorString(e), devices);
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device 0: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);

  // 1. every dtype x op
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& in : collx_cuda_test::all_instances()) {
    const std::string r = in.check();
    expect(r.empty(), std::string("reduce ") + in.type + " " + in.op + ": " + r);
  }
  std::printf("dtype x op: %zu instances checked (%.1f s)\n", collx_cuda_test::all_instances().size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  // 2. every collective x policy
  namespace algo = collx::algo;
  for (int n : quick ? std::vector<int>{2} : std::vector<int>{1, 2, 4, 8}) {
    const auto t = std::chrono::steady_clock::now();
    collectives<algo::ring>(n, "ring");
    collectives<algo::tree>(n, "tree");
    collectives<algo::recursive_halving>(n, "recursive_halving");
    collectives<algo::recursive_doubling>(n, "recursive_doubling");
    collectives<algo::pairwise>(n, "pairwise");
    collectives<algo::automatic>(n, "automatic");
    std::printf("collectives at N=%d: done (%.1f s)\n", n, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
  }

  // 3. splits: the pairs of a job (as DP/TP groups are), each reducing on its own group, then
  // the job again, and a split of a split
  for (int n : {4, 5}) {
    std::vector<std::string> notes(static_cast<std::size_t>(n));
    try {
      collx::cuda::launch_threads(n, [&](auto& comm) {
        const int r = comm.rank();
        std::string& note = notes[std::size_t(r)];
        auto pair = comm.split(r / 2, r, "pair");
        const int first = r / 2 * 2, members = std::min(2, n - first);
        std::vector<std::int32_t> h(1000);
        for (std::size_t i = 0; i < h.size(); ++i) h[i] = val(r, i);
        device_vec<std::int32_t> d(h);
        collx::all_reduce(pair, d.span(), collx::ops::sum{});
        auto got = d.get();
        for (std::size_t i = 0; i < h.size() && note.empty(); ++i) {
          std::int32_t want = 0;
          for (int q = first; q < first + members; ++q) want += val(q, i);
          if (got[i] != want) note = "the pair's all_reduce is wrong at " + std::to_string(i);
        }
        device_vec<std::int32_t> e(h);
        collx::all_reduce(comm, e.span(), collx::ops::sum{});
        got = e.get();
        for (std::size_t i = 0; i < h.size() && note.empty(); ++i) {
          std::int32_t want = 0;
          for (int q = 0; q < n; ++q) want += val(q, i);
          if (got[i] != want) note = "the job's all_reduce after the split is wrong at " + std::to_string(i);
        }
        auto alone = pair.split(pair.rank(), 0, "alone");
        device_vec<std::int32_t> f(h);
        collx::all_reduce(alone, f.span(), collx::ops::sum{});
        got = f.get();
        for (std::size_t i = 0; i < h.size() && note.empty(); ++i)
          if (got[i] != h[i]) note = "a one-rank split's all_reduce changed element " + std::to_string(i);
      }, bounded());
      const std::string first = first_note(notes);
      expect(first.empty(), "splits at N=" + std::to_string(n) + ": " + first);
    } catch (const std::exception& e) {
      expect(false, "splits at N=" + std::to_string(n) + ": " + e.what());
    }
  }
  std::printf("splits: done\n");

  // 4. a fused batch of all-reduces: packed into the transport's device pack buffer
  for (int n : {2, 3}) {
    std::vector<std::string> notes(static_cast<std::size_t>(n));
    try {
      collx::cuda::launch_threads(n, [&](auto& comm) {
        const int r = comm.rank();
        const std::size_t sizes[3] = {1000, 1, 4099};
        std::vector<std::unique_ptr<device_vec<std::int32_t>>> bufs;
        for (std::size_t b = 0; b < 3; ++b) {
          std::vector<std::int32_t> h(sizes[b]);
          for (std::size_t i = 0; i < h.size(); ++i) h[i] = val(r, i + 10000 * b);
          bufs.push_back(std::make_unique<device_vec<std::int32_t>>(h));
        }
        collx::fused batch(comm);
        for (auto& b : bufs) batch.all_reduce(b->span(), collx::ops::sum{});
        batch.run();
        for (std::size_t b = 0; b < 3 && notes[std::size_t(r)].empty(); ++b) {
          const auto got = bufs[b]->get();
          for (std::size_t i = 0; i < sizes[b]; ++i) {
            std::int32_t want = 0;
            for (int q = 0; q < n; ++q) want += val(q, i + 10000 * b);
            if (got[i] != want) {
              notes[std::size_t(r)] = "part " + std::to_string(b) + " wrong at " + std::to_string(i);
              break;
            }
          }
        }
      }, bounded());
      const std::string first = first_note(notes);
      expect(first.empty(), "fused at N=" + std::to_string(n) + ": " + first);
    } catch (const std::exception& e) {
      expect(false, "fused at N=" + std::to_string(n) + ": " + e.what());
    }
  }
  std::printf("fused: done\n");

  // 5. stream-ordered nonblocking calls: more in flight than the status slots, a caller's own
  // stream, and an error reported by the work
  {
    std::vector<std::string> notes(2);
    try {
      collx::cuda::launch_threads(2, [&](auto& comm) {
        const int r = comm.rank();
        std::string& note = notes[std::size_t(r)];
        std::vector<std::unique_ptr<device_vec<float>>> bufs;
        std::vector<collx::work> works;
        for (int c = 0; c < 100; ++c) {
          bufs.push_back(std::make_unique<device_vec<float>>(std::vector<float>(4099, float(r + c))));
          works.push_back(collx::async::all_reduce(comm, bufs.back()->span(), collx::ops::sum{}));
        }
        bool seen_done = false;
        for (auto& w : works) {
          w.wait();
          seen_done = seen_done || w.test();
        }
        if (!seen_done) note = "test() never true after wait()";
        for (int c = 0; c < 100 && note.empty(); ++c)
          if (bufs[std::size_t(c)]->get()[4098] != float(1 + 2 * c)) note = "async call " + std::to_string(c) + " wrong";
        // ordered on the caller's stream: a memset enqueued there before the call is its input
        cudaStream_t mine = nullptr;
        collx::cuda::check(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking), "cudaStreamCreate");
        device_vec<std::int32_t> d(1000);
        comm.transport().use_stream(mine);
        collx::cuda::check(cudaMemsetAsync(d.p, 1, 1000 * sizeof(std::int32_t), mine), "cudaMemsetAsync");
        collx::work w = collx::async::all_reduce(comm, d.span(), collx::ops::sum{});
        w.wait();
        comm.transport().use_stream(nullptr);
        cudaStreamDestroy(mine);
        if (note.empty() && d.get()[999] != 2 * 0x01010101) note = "the call did not follow the caller's stream";
      }, bounded());
      const std::string first = first_note(notes);
      expect(first.empty(), "stream-ordered calls: " + first);
    } catch (const std::exception& e) {
      expect(false, std::string("stream-ordered calls: ") + e.what());
    }
    collx::options o;
    o.timeout = std::chrono::milliseconds(500);
    const std::string e = error_of(2, [](auto& comm) {
      device_vec<float> d(comm.rank() == 1 ? 12 : 10);
      collx::work w = collx::async::all_reduce(comm, d.span(), collx::ops::sum{}, collx::algo::ring{});
      w.wait();
    }, o);
    expect(e.find("made different calls") != std::string::npos || e.find("counts differ") != std::string::npos,
           "a stream-ordered call's mismatch, from wait(): " + e);
  }
  std::printf("stream-ordered: done\n");

  // 6. errors end every wait
  collx::options o;
  o.timeout = std::chrono::milliseconds(500);
  {
    const std::string e = error_of(3, [](auto& comm) {
      device_vec<float> d(comm.rank() == 1 ? 12 : 10);
      collx::all_reduce(comm, d.span(), collx::ops::sum{}, collx::algo::ring{});
    }, o);
    // The counts are in the signature, so the peer's message is of a different call.
    expect(e.find("made different calls") != std::string::npos || e.find("counts differ") != std::string::npos,
           "mismatched sizes: " + e);
    std::printf("mismatch: %s\n", e.c_str());
  }
  {
    const auto t = std::chrono::steady_clock::now();
    const std::string e = error_of(2, [](auto& comm) {
      device_vec<float> d(100);
      if (comm.rank() == 0) collx::all_reduce(comm, d.span(), collx::ops::sum{}, collx::algo::ring{});
      else std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    }, o);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    expect(e.find("waiting for rank 1") != std::string::npos, "a rank that never calls: " + e);
    std::printf("timeout (%.2f s): %s\n", s, e.c_str());
  }
  {
    const std::string e = error_of(4, [](auto& comm) {
      device_vec<float> d(1000);
      if (comm.rank() == 2) throw std::runtime_error("rank 2 gives up");
      collx::all_reduce(comm, d.span(), collx::ops::sum{}, collx::algo::tree{});
    }, o);
    expect(e.find("rank 2 gives up") != std::string::npos, "a failed rank: " + e);
  }
  std::printf("%d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
