#pragma once
// transport::counting<T>: a decorator that records what a rank sends, receives and reduces, step
// by step, and otherwise forwards to T. Tests compare these counts with each policy's cost
// formula; the model compares them with its own walk of the schedule.
#include <cstdint>
#include <span>
#include <utility>

#include "../core/concepts.hpp"
#include "../core/traffic.hpp"
#include "../core/split_plan.hpp"

namespace collx::transport {


template <class T>
class counting {
 public:
  using transport_concept = transport_tag;
  using memory_space = typename T::memory_space;
  static constexpr const char* name = "counting";

  explicit counting(T inner) : inner_(std::move(inner)) {}

  int rank() const noexcept { return inner_.rank(); }
  int size() const noexcept { return inner_.size(); }
  bool takes_pieces() const noexcept { return detail::takes_pieces(inner_); }

  void exchange(std::span<const send_desc> s, std::span<const recv_desc> r, const exchange_context& ctx) {
    inner_.exchange(s, r, ctx);
    if (!s.empty() || !r.empty()) ++t_.steps;
    for (const auto& x : s) { ++t_.messages_sent; t_.bytes_sent += x.bytes; }
    for (const auto& x : r) {
      ++t_.messages_received;
      t_.bytes_received += x.bytes;
      if (x.how != combine::copy) t_.bytes_reduced += x.bytes;
    }
  }
  /// Receive from any source: the inner transport's (what it then receives is counted as usual).
  int probe(std::span<const int> peers, const call_info& call)
    requires requires(T& t) { t.probe(peers, call); }
  { return inner_.probe(peers, call); }
  void abort(const std::string& why) noexcept { inner_.abort(why); }
  void leave() noexcept
    requires requires(T& t) { t.leave(); }
  { inner_.leave(); }

  split_offer prepare_split()
    requires requires(T& t) { t.prepare_split(); }
  { return inner_.prepare_split(); }
  counting split(const split_plan& p, split_offer&& o) const
    requires requires(const T& t, split_offer&& x) { t.split(p, std::move(x)); }
  { return counting(inner_.split(p, std::move(o))); }

  const traffic& counts() const noexcept { return t_; }
  void reset() noexcept { t_ = {}; }
  T& inner() noexcept { return inner_; }
  const T& inner() const noexcept { return inner_; }

 private:
  T inner_;
  traffic t_;
};

}  // namespace collx::transport
