#pragma once
// Builds every rank's schedule for one collective and policy, without running anything, so
// tests can check them against each other (matching), against themselves (hazards) and against
// cost formulas.
#include <collx/collx.hpp>
#include <collx/algo/model.hpp>

#include <string>
#include <vector>

namespace collx_test {

using coll = collx::algo::collective;
using collx::model::name;

/// The schedules of all n ranks, as the collectives build them (collx::model::schedules).
/// `count` is the collective's count argument.
template <class Algo>
std::vector<collx::schedule> schedules(const Algo& a, coll c, int n, std::size_t count, int root = 0,
                                       bool commutative = true, std::size_t elem = 4) {
  return collx::model::schedules(a, collx::model::problem{c, n, count, elem, root, commutative});
}

/// Every send must meet a receive of the same size in the same step of its peer, in the same
/// order among the messages of that pair; no step may send from memory it receives into.
/// Returns "" or the first problem found.
inline std::string check_consistent(const std::vector<collx::schedule>& all) {
  using namespace collx;
  const int n = int(all.size());
  struct msg { int time; std::size_t count; };
  // per (from, to): ordered list of (time, count) sent and received
  std::vector<std::vector<msg>> sent(std::size_t(n * n)), got(std::size_t(n * n));
  for (int r = 0; r < n; ++r) {
    const schedule& s = all[std::size_t(r)];
    int last = -1;
    for (const step& st : s.steps()) {
      if (st.time <= last) return "rank " + std::to_string(r) + ": step times not increasing";
      last = st.time;
      for (auto i = st.sends_begin; i < st.sends_end; ++i) {
        const send_op& o = s.sends()[i];
        if (o.peer < 0 || o.peer >= n || o.peer == r) return "rank " + std::to_string(r) + ": bad peer";
        sent[std::size_t(r * n + o.peer)].push_back({st.time, o.src.count});
        for (auto j = st.recvs_begin; j < st.recvs_end; ++j) {
          const region& d = s.recvs()[j].dst;
          if (d.b == o.src.b && d.count && o.src.count && d.offset < o.src.offset + o.src.count &&
              o.src.offset < d.offset + d.count)
            return "rank " + std::to_string(r) + " t" + std::to_string(st.time) + ": sends from memory it receives into";
        }
      }
      for (auto i = st.recvs_begin; i < st.recvs_end; ++i) {
        const recv_op& o = s.recvs()[i];
        if (o.peer < 0 || o.peer >= n || o.peer == r) return "rank " + std::to_string(r) + ": bad peer";
        got[std::size_t(o.peer * n + r)].push_back({st.time, o.dst.count});
        if (o.how != combine::copy && o.with.count != o.dst.count) return "combine operand sizes differ";
      }
    }
  }
  for (int f = 0; f < n; ++f)
    for (int t = 0; t < n; ++t) {
      const auto& a = sent[std::size_t(f * n + t)];
      const auto& b = got[std::size_t(f * n + t)];
      if (a.size() != b.size())
        return "rank " + std::to_string(f) + " sends " + std::to_string(a.size()) + " messages to rank " +
               std::to_string(t) + ", which receives " + std::to_string(b.size());
      for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].time != b[i].time || a[i].count != b[i].count)
          return "message " + std::to_string(i) + " from rank " + std::to_string(f) + " to " + std::to_string(t) +
                 ": sent at t" + std::to_string(a[i].time) + " (" + std::to_string(a[i].count) + " elements), received at t" +
                 std::to_string(b[i].time) + " (" + std::to_string(b[i].count) + ")";
    }
  return {};
}

/// The length of the global timeline: the number of steps on the critical path.
inline int span(const std::vector<collx::schedule>& all) { return collx::model::timeline(all); }

}  // namespace collx_test
