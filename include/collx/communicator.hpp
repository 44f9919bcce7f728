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
#include <memory>
#include <unordered_map>

#include "algo/profile.hpp"
#include "concepts.hpp"
#include "env.hpp"
#include "error.hpp"
#include "detail/schedule_cache.hpp"
#include "schedule.hpp"

namespace collx {

namespace detail {
/// options::timeout's default: COLLX_TIMEOUT_S (seconds, may be fractional) or 300 s.
inline std::chrono::nanoseconds default_timeout() {
  return std::chrono::nanoseconds(static_cast<std::int64_t>(env_seconds("COLLX_TIMEOUT_S", 300) * 1e9));
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

  using schedule_key = detail::schedule_key;

  /// The schedule of key k, from this communicator's cache (detail/schedule_cache.hpp), built by
  /// build() when not there. The caller holds it for as long as it runs it.
  template <class Build>
  std::shared_ptr<const schedule> cached_schedule(const schedule_key& k, Build&& build) {
    return cache_.get(k, std::forward<Build>(build));
  }
  detail::schedule_cache& schedules() noexcept { return cache_; }

  /// algo::automatic's state for this communicator (collectives/common.hpp fills and reads it):
  /// the cost model's parameters and COLLX_ALGO's overrides as rank 0 has them (every rank then
  /// decides alike), and the last decisions.
  struct automatic_state {
    /// model::params' numbers, trivially copyable: rank 0 broadcasts them as they are.
    struct numbers {
      double alpha = 0, beta = 0, gamma = 0, delta = 0;
      std::int32_t cores = 0, ranks = 0;  // model::params' sharing of cores
      algo::step_curve curve;             // measured step times, if any (model.hpp)
      algo::policy_fit fit;               // measured / predicted per policy, if any
    };
    bool ready = false;
    numbers n;
    std::string source;
    std::array<std::int8_t, 6> forced{-1, -1, -1, -1, -1, -1};  // per algo::collective: a choice, -1, or -2 (the model)
    std::int8_t forced_all = -1;                                 // COLLX_ALGO's global policy, or -1
    /// The model's choice per call shape (collective, commutativity, count, element size):
    /// a training step's shapes are a few hundred at most; past kMaxDecisions they start over.
    struct shape_hash {
      std::size_t operator()(const std::array<std::uint64_t, 4>& k) const noexcept {
        std::uint64_t h = 0x9e3779b97f4a7c15ull;
        for (std::uint64_t x : k) h = (h ^ x) * 0x100000001b3ull + (h >> 31);
        return std::size_t(h);
      }
    };
    static constexpr std::size_t kMaxDecisions = std::size_t(1) << 16;
    std::unordered_map<std::array<std::uint64_t, 4>, std::int8_t, shape_hash> decisions;
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
  detail::schedule_cache cache_;
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
