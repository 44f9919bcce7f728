#pragma once
// The schedules a communicator keeps for reuse, bounded by the bytes they take.
//
// Policies are pure functions of their problem, so a schedule built once serves every later call
// of the same shape (a training loop's all-reduce, a benchmark): building one costs a few
// allocations (~100 ns for a small one, which is a third of a small all-reduce between processes)
// and at a thousand ranks a ring's is ~2000 steps. A training step calls many shapes in a cycle
// (DDP's buckets, a model's layers), so the cache is least-recently-used over a byte budget
// (COLLX_SCHEDULE_CACHE_BYTES, default 64 MiB), not a handful of slots that a cycle of nine
// shapes would miss on every call. Entries are shared: a schedule handed out stays alive for as
// long as its caller runs it, whatever the cache evicts meanwhile.
#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>

#include "../core/settings.hpp"
#include "../core/schedule.hpp"

namespace collx::detail {

/// What identifies a schedule: the policy and problem types (kind) and the values of every
/// field of the policy and the problem (key_of below: taken field by field, so a field added to
/// a problem is part of the key without anyone listing it).
struct schedule_key {
  static constexpr std::size_t kValues = 16;
  const void* kind = nullptr;
  std::array<std::uint64_t, kValues> v{};
  std::uint32_t n = 0;
  friend bool operator==(const schedule_key&, const schedule_key&) = default;
  void add(std::uint64_t x) {
    if (n == kValues) throw std::logic_error("collx: a schedule key holds at most 16 values");
    v[n++] = x;
  }
};

/// The number of fields of an aggregate (or of a class whose constructor takes one argument per
/// public field, as partition's): the most initialisers it accepts.
struct any_field {
  template <class X>
  constexpr operator X() const noexcept;  // only ever named in unevaluated tests
};
template <class P, class... A>
constexpr std::size_t field_count() {
  if constexpr (sizeof...(A) < 10 && requires { P{A{}..., any_field{}}; }) return field_count<P, A..., any_field>();
  else return sizeof...(A);
}

/// Adds every scalar reachable through x's fields to k (arithmetic and enum values; classes
/// field by field, as structured bindings see them).
template <class X>
void add_fields(schedule_key& k, const X& x) {
  if constexpr (std::is_arithmetic_v<X> || std::is_enum_v<X>) {
    k.add(std::uint64_t(x));
  } else if constexpr (std::is_empty_v<X>) {
  } else {
    constexpr std::size_t n = field_count<X>();
    static_assert(n >= 1 && n <= 8, "collx: a schedule problem has 1 to 8 public fields, each a scalar or such a struct");
    if constexpr (n == 1) {
      const auto& [a] = x;
      add_fields(k, a);
    } else if constexpr (n == 2) {
      const auto& [a, b] = x;
      (add_fields(k, a), add_fields(k, b));
    } else if constexpr (n == 3) {
      const auto& [a, b, c] = x;
      (add_fields(k, a), add_fields(k, b), add_fields(k, c));
    } else if constexpr (n == 4) {
      const auto& [a, b, c, d] = x;
      (add_fields(k, a), add_fields(k, b), add_fields(k, c), add_fields(k, d));
    } else if constexpr (n == 5) {
      const auto& [a, b, c, d, e] = x;
      (add_fields(k, a), add_fields(k, b), add_fields(k, c), add_fields(k, d), add_fields(k, e));
    } else if constexpr (n == 6) {
      const auto& [a, b, c, d, e, f] = x;
      (add_fields(k, a), add_fields(k, b), add_fields(k, c), add_fields(k, d), add_fields(k, e), add_fields(k, f));
    } else if constexpr (n == 7) {
      const auto& [a, b, c, d, e, f, g] = x;
      (add_fields(k, a), add_fields(k, b), add_fields(k, c), add_fields(k, d), add_fields(k, e), add_fields(k, f),
       add_fields(k, g));
    } else {
      const auto& [a, b, c, d, e, f, g, h] = x;
      (add_fields(k, a), add_fields(k, b), add_fields(k, c), add_fields(k, d), add_fields(k, e), add_fields(k, f),
       add_fields(k, g), add_fields(k, h));
    }
  }
}

struct schedule_key_hash {
  std::size_t operator()(const schedule_key& k) const noexcept {
    std::uint64_t h = std::uint64_t(reinterpret_cast<std::uintptr_t>(k.kind)) * 0x9e3779b97f4a7c15ull;
    for (std::uint32_t i = 0; i < k.n; ++i) h = (h ^ k.v[i]) * 0x100000001b3ull + (h >> 29);
    return std::size_t(h);
  }
};

class schedule_cache {
 public:
  /// The default budget: COLLX_SCHEDULE_CACHE_BYTES, else 64 MiB.
  static std::size_t default_budget() {
    return std::size_t(env_bytes("COLLX_SCHEDULE_CACHE_BYTES", 0, std::uint64_t(64) << 30, std::uint64_t(64) << 20));
  }

  explicit schedule_cache(std::size_t budget = default_budget()) : budget_(budget) {}

  /// The schedule of `k`, built by `build()` when not cached. A schedule larger than the whole
  /// budget is built and returned, not kept.
  template <class Build>
  std::shared_ptr<const schedule> get(const schedule_key& k, Build&& build) {
    if (!lru_.empty() && lru_.front().key == k) {  // the same shape again: the common case
      ++hits_;
      return lru_.front().s;
    }
    if (auto it = index_.find(k); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return lru_.front().s;
    }
    ++misses_;
    auto s = std::make_shared<const schedule>(build());
    const std::size_t b = s->memory_bytes();
    if (b > budget_) return s;
    lru_.push_front({k, s, b});
    index_.emplace(k, lru_.begin());
    bytes_ += b;
    while (bytes_ > budget_) {
      bytes_ -= lru_.back().bytes;
      index_.erase(lru_.back().key);
      lru_.pop_back();
    }
    return s;
  }

  std::size_t bytes() const noexcept { return bytes_; }
  std::size_t entries() const noexcept { return lru_.size(); }
  std::size_t budget() const noexcept { return budget_; }
  std::uint64_t hits() const noexcept { return hits_; }
  std::uint64_t misses() const noexcept { return misses_; }
  void set_budget(std::size_t b) {
    budget_ = b;
    while (bytes_ > budget_ && !lru_.empty()) {
      bytes_ -= lru_.back().bytes;
      index_.erase(lru_.back().key);
      lru_.pop_back();
    }
  }

 private:
  struct entry {
    schedule_key key;
    std::shared_ptr<const schedule> s;
    std::size_t bytes;
  };
  std::size_t budget_;
  std::size_t bytes_ = 0;
  std::uint64_t hits_ = 0, misses_ = 0;
  std::list<entry> lru_;  // most recently used first
  std::unordered_map<schedule_key, std::list<entry>::iterator, schedule_key_hash> index_;
};

}  // namespace collx::detail
