#pragma once
// The schedules a communicator keeps for reuse, bounded by the bytes they take.
//
// Policies are pure functions of their problem, so a schedule built once serves every later call
// of the same shape (a training loop's all-reduce, a benchmark): building one costs a few
// allocations (~100 ns for a small one, which is a third of a small all-reduce between processes)
// and at a thousand ranks a ring's is ~2000 steps. A training step calls many shapes in a cycle
// (DDP's buckets, a model's layers), so the cache is least-recently-used over a byte budget
// (COLLX_SCHEDULE_CACHE_BYTES, default 64 MiB), not a handful of slots that a cycle of nine
// shapes would miss on every call. A schedule is handed out as a plain pointer (no reference count
// to touch on a hit: a small call is a few hundred nanoseconds): the cache never evicts the two
// schedules it handed out last, so a caller may hold the last two it got (a segmented all_reduce
// holds its full segment's while it gets the last one's) whatever the gets between evict.
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
  std::array<std::uint64_t, kValues> v;  // (the first n are set: a key is made every call)
  std::uint32_t n = 0;
  /// Only the values added count (the rest are zero anyway): a hit compares a few words, not 16.
  friend bool operator==(const schedule_key& a, const schedule_key& b) noexcept {
    if (a.kind != b.kind || a.n != b.n) return false;
    for (std::uint32_t i = 0; i < a.n; ++i)
      if (a.v[i] != b.v[i]) return false;
    return true;
  }
  /// This key with the values past n zeroed: the copy the cache keeps (a key is built on the
  /// stack every call, and only its first n values are ever set).
  schedule_key kept() const noexcept {
    schedule_key c;
    c.kind = kind;
    c.n = n;
    for (std::uint32_t i = 0; i < kValues; ++i) c.v[i] = i < n ? v[i] : 0;
    return c;
  }
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

  /// The schedule of `k`, built by `build(ctx)` when not cached, and kept shrunk to its size.
  /// Good until two more gets have come after this one (the two most recent are never evicted;
  /// so a schedule larger than the whole budget stays until two others have come after it).
  /// The builder is a plain function and a context, not a template parameter: this is compiled
  /// once, not once for every collective x element type x op x policy that calls it.
  using builder = schedule (*)(void* ctx);
  const schedule* get(const schedule_key& k, builder build, void* ctx) {
    if (!lru_.empty() && lru_.front().key == k) {  // the same shape again: the common case
      ++hits_;
      return lru_.front().s.get();
    }
    if (auto it = index_.find(k); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return lru_.front().s.get();
    }
    ++misses_;
    schedule built = build(ctx);
    built.shrink();
    auto s = std::make_unique<const schedule>(std::move(built));
    const std::size_t b = s->memory_bytes();
    lru_.push_front({k.kept(), std::move(s), b});
    index_.emplace(lru_.front().key, lru_.begin());
    bytes_ += b;
    evict(2);
    return lru_.front().s.get();
  }
  /// The same, with any callable returning a schedule.
  template <class Build>
  const schedule* get(const schedule_key& k, Build& build) {
    return get(k, [](void* c) -> schedule { return (*static_cast<Build*>(c))(); }, static_cast<void*>(&build));
  }

  std::size_t bytes() const noexcept { return bytes_; }
  std::size_t entries() const noexcept { return lru_.size(); }
  std::size_t budget() const noexcept { return budget_; }
  std::uint64_t hits() const noexcept { return hits_; }
  std::uint64_t misses() const noexcept { return misses_; }
  /// A new budget, kept at once (between calls: no schedule handed out is held then).
  void set_budget(std::size_t b) {
    budget_ = b;
    evict(0);
  }

 private:
  struct entry {
    schedule_key key;
    std::unique_ptr<const schedule> s;
    std::size_t bytes;
  };
  /// Evicts the least recently used entries until the budget holds, keeping the `keep` most recent.
  void evict(std::size_t keep) {
    while (bytes_ > budget_ && lru_.size() > keep) {
      bytes_ -= lru_.back().bytes;
      index_.erase(lru_.back().key);
      lru_.pop_back();
    }
  }
  std::size_t budget_;
  std::size_t bytes_ = 0;
  std::uint64_t hits_ = 0, misses_ = 0;
  std::list<entry> lru_;  // most recently used first
  std::unordered_map<schedule_key, std::list<entry>::iterator, schedule_key_hash> index_;
};

}  // namespace collx::detail
