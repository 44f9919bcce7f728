#pragma once
// The one ownership rule: N elements over P ranks. Block i has N/P elements, plus one for the
// first N%P blocks, and blocks are laid out in rank order. Every policy and every collective that
// splits a buffer between ranks uses this, so "rank i owns block i" means the same thing everywhere.
#include <algorithm>
#include <cstddef>

namespace collx {

struct partition {
  std::size_t total = 0;
  int parts = 1;

  constexpr partition() = default;
  constexpr partition(std::size_t n, int p) : total(n), parts(p) {}

  constexpr std::size_t count(int i) const noexcept {
    return total / std::size_t(parts) + (std::size_t(i) < total % std::size_t(parts) ? 1 : 0);
  }
  constexpr std::size_t offset(int i) const noexcept {
    return std::size_t(i) * (total / std::size_t(parts)) + std::min<std::size_t>(std::size_t(i), total % std::size_t(parts));
  }
  /// Offset one past block i-1: offset(parts) == total.
  constexpr std::size_t end(int i) const noexcept { return offset(i) + count(i); }
  constexpr std::size_t max_count() const noexcept { return count(0); }
};

}  // namespace collx
