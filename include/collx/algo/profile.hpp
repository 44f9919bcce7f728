#pragma once
// The load of a schedule on the common timeline, step by step, over all ranks at once: what the
// cost model (algo/model.hpp) charges. For each step (steps of all ranks with equal time run
// together):
//   active   the ranks with a message in it,
//   bytes    the most bytes one rank sends or receives in it,
//   both     the most bytes one rank moves in its smaller direction (it sends and receives),
//   reduced  the most bytes one rank reduces in it,
// kept as runs of equal steps (`repeat`), so that a ring's 2(N-1) identical steps are one entry.
//
// The model gets a profile by walking every rank's schedule (algo/model.hpp, walk), or, for the
// policies and collectives where that walk is O(N²) (every rank of a ring has N-1 steps), from
// the policy's own structure: a policy may supply `<collective>_loads(problem)`, which must
// give exactly what the walk gives (tests/test_model.cpp checks every such function against it,
// over rank counts 1..33 and uneven sizes). This file is also where they share their arithmetic.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../core/schedule.hpp"
#include "automatic.hpp"
#include "collectives.hpp"

namespace collx::algo {

struct step_load {
  std::uint32_t active = 0;
  std::uint64_t bytes = 0, both = 0, reduced = 0;
  std::uint64_t repeat = 1;  // this many equal steps in a row
  bool same_load(const step_load& o) const noexcept {
    return active == o.active && bytes == o.bytes && both == o.both && reduced == o.reduced;
  }
  friend bool operator==(const step_load&, const step_load&) = default;
};
using load_runs = std::vector<step_load>;

/// Appends `repeat` steps of load `s` to `runs`, merging with the last run when equal.
inline void push_load(load_runs& runs, step_load s, std::uint64_t repeat = 1) {
  if (repeat == 0) return;
  s.repeat = repeat;
  if (!runs.empty() && runs.back().same_load(s)) runs.back().repeat += repeat;
  else runs.push_back(s);
}

/// Appends `b` after `a` on the timeline.
inline void append_loads(load_runs& a, const load_runs& b) {
  for (const step_load& s : b) push_load(a, s, s.repeat);
}

/// Steps on the timeline (the sum of the runs).
inline std::uint64_t timeline_steps(const load_runs& r) {
  std::uint64_t t = 0;
  for (const step_load& s : r) t += s.repeat;
  return t;
}

/// Per-step maxima over ranks, gathered one rank's step at a time (the walk).
class load_maxima {
 public:
  /// `times` ranks' steps at `time` each send `out`, receive `in` and reduce `red` bytes.
  void add(int time, std::uint64_t out, std::uint64_t in, std::uint64_t red, std::uint32_t times = 1) {
    if (std::size_t(time) >= t_.size()) t_.resize(std::size_t(time) + 1);
    step_load& s = t_[std::size_t(time)];
    s.active += times;
    s.bytes = std::max({s.bytes, out, in});
    s.both = std::max(s.both, std::min(out, in));
    s.reduced = std::max(s.reduced, red);
  }
  /// Adds every step with a message of schedule `s` (elements of `elem` bytes), `times` ranks alike.
  void add(const schedule& s, std::size_t elem, std::uint32_t times = 1) {
    for (const step& st : s.steps()) {
      if (st.sends_end == st.sends_begin && st.recvs_end == st.recvs_begin) continue;
      std::uint64_t out = 0, in = 0, red = 0;
      for (auto i = st.sends_begin; i < st.sends_end; ++i) out += s.sends()[i].src.count * elem;
      for (auto i = st.recvs_begin; i < st.recvs_end; ++i) {
        const recv_op& r = s.recvs()[i];
        in += r.dst.count * elem;
        if (r.how != combine::copy) red += r.dst.count * elem;
      }
      add(st.time, out, in, red, times);
    }
  }
  /// The runs along the timeline: from step 0 to the last step with a message.
  load_runs runs() const {
    load_runs r;
    for (const step_load& s : t_) push_load(r, s);
    return r;
  }
  std::size_t span() const noexcept { return t_.size(); }

 private:
  std::vector<step_load> t_;
};

/// Step times measured at a ladder of message sizes (collx-perf --calibrate): what one step of a
/// pair of ranks costs when it sends `bytes` one way, when both send `bytes` to each other at
/// once, and when both also reduce what they receive. Between the sizes it is linear in the
/// bytes, beyond the largest it goes on along the last segment. Trivially copyable: rank 0
/// broadcasts it to every rank with the rest of its parameters.
struct step_curve {
  static constexpr int kMax = 16;
  std::int32_t n = 0;  // measured sizes, ascending; 0: none (the linear model below)
  double bytes[kMax] = {}, one_way[kMax] = {}, exchange[kMax] = {}, reduce[kMax] = {};

  /// The curve `y` at `b` bytes.
  double at(const double (&y)[kMax], double b) const {
    if (b <= bytes[0] || n == 1) return y[0];
    int i = 1;
    while (i < n - 1 && bytes[i] < b) ++i;
    const double slope = (y[i] - y[i - 1]) / (bytes[i] - bytes[i - 1]);
    return std::max(y[0], y[i - 1] + slope * (b - bytes[i - 1]));
  }
};

/// How far each policy's measured time is from the model's prediction, by collective and size
/// (collx-perf --calibrate runs every policy at sizes x2 apart and keeps measured / predicted).
/// The model multiplies its prediction by the factor at the call's size (interpolated in log2 of
/// the bytes between the sizes measured, the nearest beyond them): what a schedule's steps
/// cannot say about a transport — a pipeline that overlaps its steps, a protocol that changes
/// with the size, a step whose buffers left the cache — is then measured rather than guessed,
/// as NCCL keeps a latency and bandwidth per algorithm and protocol. Trivially copyable.
struct policy_fit {
  static constexpr int kSizes = 24, kCollectives = int(algo::kCollectives), kPolicies = 8;  // room for algo::policies
  std::int32_t nsizes = 0;
  double bytes[kSizes] = {};
  float factor[kCollectives][kPolicies][kSizes] = {};  // 0: not measured

  /// The index of size b, added in order when new (-1 when full).
  int slot(double b) {
    int i = 0;
    while (i < nsizes && bytes[i] < b) ++i;
    if (i < nsizes && bytes[i] == b) return i;
    if (nsizes == kSizes) return -1;
    for (int j = nsizes; j > i; --j) {
      bytes[j] = bytes[j - 1];
      for (auto& c : factor)
        for (auto& p : c) p[j] = p[j - 1];
    }
    bytes[i] = b;
    for (auto& c : factor)
      for (auto& p : c) p[i] = 0;
    ++nsizes;
    return i;
  }

  /// The factor for collective c, policy p at b bytes (1 when none was measured).
  double at(collective c, choice p, double b) const {
    const float* f = factor[int(c)][int(p)];
    int lo = -1, hi = -1;
    for (int i = 0; i < nsizes; ++i) {
      if (f[i] <= 0) continue;
      if (bytes[i] <= b) lo = i;
      if (bytes[i] >= b && hi < 0) hi = i;
    }
    if (lo < 0 && hi < 0) return 1.0;
    if (lo < 0) return f[hi];
    if (hi < 0 || hi == lo) return f[lo];
    const double x = std::log2(std::max(1.0, b)), x0 = std::log2(std::max(1.0, bytes[lo])), x1 = std::log2(std::max(1.0, bytes[hi]));
    return f[lo] + (f[hi] - f[lo]) * (x - x0) / (x1 - x0);
  }
};

}  // namespace collx::algo
