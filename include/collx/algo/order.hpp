#pragma once
// The order a reduction adds in, read off the schedules: every rank's schedule is run on
// symbols instead of numbers (rank q's contribution is "xq"; a receive that reduces makes
// "(a + b)" with the sender's partial on the side the schedule says; a fold makes
// "((x0 + x1) + x2)"), so what each rank ends with is the expression its result was computed
// by. Floating-point addition rounds after every "+", so two expressions that differ give
// results that may differ in their last bits (docs/precision.md); collx-explain --order prints
// them, and tests/test_deterministic.cpp checks algo::deterministic's against rank order.
#include <cstddef>
#include <deque>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../core/schedule.hpp"

namespace collx::algo {

/// What each rank's `out` holds after running `per_rank` (one schedule per rank, every element
/// of rank q's input the symbol "xq"), element by element. Throws std::logic_error when a
/// receive finds no message of its size from its peer at its step.
inline std::vector<std::vector<std::string>> addition_order(const std::vector<schedule>& per_rank, std::size_t in_count,
                                                            std::size_t out_count) {
  const int n = int(per_rank.size());
  struct rank_state {
    std::vector<std::string> in, out, tmp;
    std::vector<std::string>& of(buf b) {
      if (b == buf::in) return in;
      if (b == buf::out) return out;
      if (b == buf::tmp) return tmp;
      throw std::logic_error("collx: addition_order: a region of no buffer");
    }
  };
  std::vector<rank_state> st(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    auto& s = st[std::size_t(q)];
    s.in.assign(in_count, "x" + std::to_string(q));
    s.out.assign(out_count, "");
    s.tmp.assign(per_rank[std::size_t(q)].tmp_elems(), "");
  }
  auto read = [&](rank_state& s, const region& r) {
    auto& v = s.of(r.b);
    if (r.offset + r.count > v.size()) throw std::logic_error("collx: addition_order: a region past its buffer");
    return std::vector<std::string>(v.begin() + std::ptrdiff_t(r.offset), v.begin() + std::ptrdiff_t(r.offset + r.count));
  };
  auto write = [&](rank_state& s, const region& r, const std::vector<std::string>& x) {
    auto& v = s.of(r.b);
    if (r.offset + r.count > v.size() || x.size() != r.count) throw std::logic_error("collx: addition_order: a region past its buffer");
    for (std::size_t i = 0; i < r.count; ++i) v[r.offset + i] = x[i];
  };
  auto plus = [](const std::string& a, const std::string& b) { return "(" + a + " + " + b + ")"; };
  // messages in flight, per (sender, receiver), in the order sent
  std::map<std::pair<int, int>, std::deque<std::vector<std::string>>> wire;
  std::map<int, std::vector<std::pair<int, const step*>>> by_time;
  for (int q = 0; q < n; ++q)
    for (const step& x : per_rank[std::size_t(q)].steps()) by_time[x.time].push_back({q, &x});
  for (auto& [t, at] : by_time) {
    for (auto [q, x] : at) {  // local operations, then sends, of every rank at this time
      const schedule& s = per_rank[std::size_t(q)];
      rank_state& me = st[std::size_t(q)];
      for (auto i = x->copies_begin; i < x->copies_end; ++i) write(me, s.copies()[i].dst, read(me, s.copies()[i].src));
      for (auto i = x->folds_begin; i < x->folds_end; ++i) {
        const fold_op& f = s.folds()[i];
        std::vector<std::string> acc;
        for (const region& r : s.srcs_of(f)) {
          const auto v = read(me, r);
          if (acc.empty()) acc = v;
          else
            for (std::size_t k = 0; k < acc.size(); ++k) acc[k] = plus(acc[k], v[k]);
        }
        write(me, f.dst, acc);
      }
      for (auto i = x->sends_begin; i < x->sends_end; ++i) wire[{q, s.sends()[i].peer}].push_back(read(me, s.sends()[i].src));
    }
    for (auto [q, x] : at) {  // then the receives, in the order each step lists them
      const schedule& s = per_rank[std::size_t(q)];
      rank_state& me = st[std::size_t(q)];
      for (auto i = x->recvs_begin; i < x->recvs_end; ++i) {
        const recv_op& r = s.recvs()[i];
        auto& line = wire[{r.peer, q}];
        if (line.empty() || line.front().size() != r.dst.count)
          throw std::logic_error("collx: addition_order: rank " + std::to_string(q) + " receives from rank " +
                                 std::to_string(r.peer) + " at step " + std::to_string(t) + " what was not sent");
        std::vector<std::string> got = std::move(line.front());
        line.pop_front();
        if (r.how != combine::copy) {
          const auto with = read(me, r.with);
          for (std::size_t k = 0; k < got.size(); ++k)
            got[k] = r.how == combine::received_left ? plus(got[k], with[k]) : plus(with[k], got[k]);
        }
        write(me, r.dst, got);
      }
    }
  }
  std::vector<std::vector<std::string>> outs;
  for (auto& s : st) {
    for (auto& e : s.out)  // (the outermost parentheses say nothing)
      if (e.size() > 1 && e.front() == '(' && e.back() == ')') e = e.substr(1, e.size() - 2);
    outs.push_back(std::move(s.out));
  }
  return outs;
}

}  // namespace collx::algo
