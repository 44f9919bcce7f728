#pragma once
// communicator<Transport>: a rank's handle on a job. It owns the transport, the options, the
// sequence number of collective calls (every rank numbers its calls the same way, so the number
// identifies a call across ranks in error messages), and scratch memory reused across calls.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <array>

#include "concepts.hpp"
#include "error.hpp"
#include "schedule.hpp"

namespace collx {

namespace detail {
/// options::timeout's default: COLLX_TIMEOUT_S (seconds, may be fractional) or 300 s.
inline std::chrono::nanoseconds default_timeout() {
  const char* env = std::getenv("COLLX_TIMEOUT_S");
  if (env == nullptr || *env == 0) return std::chrono::seconds(300);
  char* end = nullptr;
  const double s = std::strtod(env, &end);
  if (end == env || *end != 0 || !(s > 0) || s > 1e9)
    throw error(errc::invalid_argument, std::string("COLLX_TIMEOUT_S=\"") + env + "\" is not a positive number of seconds");
  return std::chrono::nanoseconds(static_cast<std::int64_t>(s * 1e9));
}
}  // namespace detail

struct options {
  /// The longest any single wait may take before the call fails with errc::timeout.
  std::chrono::nanoseconds timeout = detail::default_timeout();
};

template <class T>
class communicator {
  static_assert(check_transport<T>());

 public:
  using transport_type = T;

  explicit communicator(T t, options o = {}) : t_(std::move(t)), opts_(o) {}

  int rank() const noexcept { return t_.rank(); }
  int size() const noexcept { return t_.size(); }
  const options& opts() const noexcept { return opts_; }
  T& transport() noexcept { return t_; }
  const T& transport() const noexcept { return t_; }

  /// The sequence number of the next collective call (1-based).
  std::uint64_t next_seq() noexcept { return ++seq_; }
  std::uint64_t calls() const noexcept { return seq_; }

  /// The digest of this rank's zero-element calls so far (signature.hpp): such calls return at
  /// once and are checked against the peers' at the next call that exchanges.
  std::uint64_t empty_calls() const noexcept { return empty_; }
  void set_empty_calls(std::uint64_t d) noexcept { empty_ = d; }

  /// What identifies a schedule: the policy and problem types (kind) and the problem's values.
  struct schedule_key {
    const void* kind = nullptr;
    std::array<std::uint64_t, 8> v{};
    friend bool operator==(const schedule_key&, const schedule_key&) = default;
  };

  /// Policies are pure functions of their problem, so a schedule built once serves every later
  /// call of the same shape (a training loop's all-reduce, a benchmark): building it costs a
  /// few allocations, ~100 ns, which is a third of a small all-reduce between processes.
  template <class Build>
  const schedule& cached_schedule(const schedule_key& k, Build&& build) {
    for (auto& e : cache_)
      if (e.valid && e.key == k) return e.s;
    auto& e = cache_[next_slot_++ % cache_.size()];
    e.valid = false;
    e.s = build();
    e.key = k;
    e.valid = true;
    return e.s;
  }

  /// algo::automatic's state for this communicator (collectives/common.hpp fills and reads it):
  /// the cost model's parameters and COLLX_ALGO's overrides as rank 0 has them (every rank then
  /// decides alike), and the last decisions.
  struct automatic_state {
    /// model::params' numbers, trivially copyable: rank 0 broadcasts them as they are.
    struct numbers {
      double alpha = 0, beta = 0, gamma = 0, delta = 0;
      std::int32_t cores = 0, ranks = 0;  // model::params' sharing of cores
    };
    bool ready = false;
    numbers n;
    std::string source;
    std::array<std::int8_t, 6> forced{-1, -1, -1, -1, -1, -1};  // per algo::collective: a choice, -1, or -2 (the model)
    std::int8_t forced_all = -1;                                 // COLLX_ALGO's global policy, or -1
    struct decision {
      std::array<std::uint64_t, 4> key{};
      std::int8_t policy = -1;
    };
    std::array<decision, 64> decisions{};
    std::size_t next = 0;
  };
  automatic_state& automatic() noexcept { return auto_; }

  /// Scratch memory for schedules that need it; grows, never shrinks, reused across calls.
  std::byte* scratch(std::size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

 private:
  T t_;
  options opts_;
  std::uint64_t seq_ = 0;
  std::uint64_t empty_ = 0;
  automatic_state auto_;
  struct cache_entry {
    bool valid = false;
    schedule_key key;
    schedule s;
  };
  std::array<cache_entry, 8> cache_{};
  std::size_t next_slot_ = 0;
  // aligned storage: max_align_t-sized elements
  struct alignas(64) line { std::byte b[64]; };
  struct bytes_vec {
    std::vector<line> v;
    std::size_t size() const { return v.size() * sizeof(line); }
    void resize(std::size_t n) { v.resize((n + sizeof(line) - 1) / sizeof(line)); }
    std::byte* data() { return v.empty() ? nullptr : v.front().b; }
  } scratch_;
};

}  // namespace collx
