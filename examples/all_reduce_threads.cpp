// all_reduce_threads: gradient averaging, as data-parallel training does it.
//
// In data-parallel training every rank holds a full copy of the model, runs forward and backward
// on its own slice of the batch, and so ends with its own gradient. Before the optimizer step the
// ranks average their gradients, so that every copy of the model takes the same step:
//
//   grads = (grads_0 + grads_1 + ... + grads_(N-1)) / N     on every rank
//
// which is one all-reduce with the avg op. Here the N = 8 ranks are threads of this process
// (collx::launch_threads, over transport::inproc), each with a "gradient" of 1'000'003 floats:
// a prime count, so the N blocks that ring and recursive halving cut the buffer into are uneven,
// as they are for real parameter counts.
//
// The program runs the call as docs/design.md shows it (in place, ring), then the out-of-place form,
// then every policy, and checks every element on every rank against the expected average.
// It exits non-zero if any element is wrong.
#include <collx/collx.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <vector>

namespace {

constexpr int kRanks = 8;
constexpr std::size_t kCount = 1'000'003;

// Rank r's gradient. The values are small integers, so every partial sum is an integer below
// 2^24 and exact in float whatever order a policy adds them in, and the average, a multiple of
// 1/8, is exact too: the check can compare with ==. (Real gradients are not exact: different
// policies then agree only up to rounding, because they add in different orders.)
float gradient(int rank, std::size_t i) { return float(i % 1000) + float(rank); }

// The average over ranks 0..N-1 of gradient(r, i): (i % 1000) + (N-1)/2.
float expected(std::size_t i) { return float(i % 1000) + float(kRanks - 1) / 2.0f; }

/// Counts the elements of `g` that differ from the expected average; keeps the first for the report.
std::size_t count_wrong(std::span<const float> g, std::string& first) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < g.size(); ++i)
    if (g[i] != expected(i)) {
      if (wrong++ == 0) first = "element " + std::to_string(i) + " is " + std::to_string(g[i]) + ", expected " +
                                std::to_string(expected(i));
    }
  return wrong;
}

struct result {
  std::atomic<std::size_t> wrong{0};  // summed over ranks
  std::string first;                  // written by rank 0 only
  double ms = 0;                      // rank 0's time for the call
};

/// Runs one all-reduce of the average on kRanks thread-ranks with policy `algo`, in place or out
/// of place, checks every rank's result and prints one line.
template <class Algo>
bool run(const char* what, Algo algo, bool in_place) {
  result res;
  collx::launch_threads(kRanks, [&](auto& comm) {
    const int r = comm.rank();
    std::vector<float> grads(kCount);
    for (std::size_t i = 0; i < kCount; ++i) grads[i] = gradient(r, i);
    std::vector<float> averaged(in_place ? 0 : kCount);

    collx::barrier(comm);  // start together, so rank 0's clock measures the collective, not the setup
    const auto t0 = std::chrono::steady_clock::now();
    if (in_place) {
      // The form a training loop uses: the gradient buffer is overwritten by the average.
      collx::all_reduce(comm, std::span{grads}, collx::ops::avg{}, algo);
    } else {
      // Out of place: the input is read only (std::span<const float>) and left as it was.
      collx::all_reduce(comm, std::span<const float>{grads}, std::span{averaged}, collx::ops::avg{}, algo);
    }
    const auto t1 = std::chrono::steady_clock::now();

    std::string first;
    std::size_t wrong = count_wrong(in_place ? grads : averaged, first);
    if (!in_place)  // the input must be untouched
      for (std::size_t i = 0; i < kCount; ++i)
        if (grads[i] != gradient(r, i)) {
          if (wrong++ == 0) first = "the input was modified at element " + std::to_string(i);
          break;
        }
    res.wrong += wrong;
    if (r == 0) {
      res.first = first;
      res.ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    }
  });
  const std::size_t wrong = res.wrong.load();
  std::printf("  %-18s %-18s %-13s %8.2f ms  %s\n", what, Algo::name, in_place ? "in place" : "out of place", res.ms,
              wrong == 0 ? "ok" : (std::to_string(wrong) + " wrong elements; rank 0: " + res.first).c_str());
  return wrong == 0;
}

}  // namespace

int main() {
  std::printf("all_reduce(avg) of %zu floats (%.1f MB) on %d thread-ranks; expected: element i = (i %% 1000) + %.1f\n",
              kCount, double(kCount * sizeof(float)) / 1e6, kRanks, double(kRanks - 1) / 2.0);
  bool ok = true;
  try {
    // The call of docs/design.md: in place, ring, the policy NCCL uses for large gradients.
    ok = run("docs/design.md's call", collx::algo::ring{}, true) && ok;
    ok = run("out-of-place form", collx::algo::ring{}, false) && ok;

    // Every policy, both forms. ring: reduce-scatter + all-gather round the ring, 2(N-1) steps;
    // tree: reduce + broadcast over a double binary tree; recursive_halving: Rabenseifner's
    // halving + doubling, 2·log2 N steps; automatic: chooses by size (ring, for 4 MB).
    // (Times are one call each, on a shared 2-core machine with 8 ranks: read them as rough.)
    auto each = [&](auto algo) {
      ok = run("each policy", algo, true) && ok;
      ok = run("each policy", algo, false) && ok;
    };
    each(collx::algo::ring{});
    each(collx::algo::tree{});
    each(collx::algo::recursive_halving{});
    each(collx::algo::automatic{});
  } catch (const std::exception& e) {  // collx::error: the message names the call, the rank and the peer
    std::fprintf(stderr, "all_reduce_threads: %s\n", e.what());
    return 1;
  }
  std::printf(ok ? "all results correct\n" : "WRONG RESULTS\n");
  return ok ? 0 : 1;
}
