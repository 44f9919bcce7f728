#pragma once
// The one list of the collectives that have schedules: what automatic chooses for, the cost
// model prices, COLLX_ALGO names, the per-collective tables size by, and collx-perf and
// collx-explain run. Each entry's traits say what every user of the list needs to know without
// a switch of its own: the name, whether it reduces, whether its buffer is N blocks (one per
// rank), whether it has a root, and nccl-tests' bus-bandwidth factor.
//
// A new collective is its file under collectives/, its enumerator, and one line here (the
// static_asserts below keep the two in step).
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>

namespace collx::algo {

enum class collective : std::uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all };

struct collective_traits {
  collective id;
  const char* name;
  bool reduces;   // combines the ranks' data with an op
  bool split;     // its buffer is N blocks, one per rank: its count is one block's
  bool rooted;    // has a root rank
  /// Bus bandwidth (nccl-tests): algbw x factor(N), what each rank's link carries per second.
  /// `bus_share` k gives k(N-1)/N; 0 gives 1.
  int bus_share;
  const char* bus;  // the factor as printed
  constexpr double bus_factor(int n) const noexcept {
    return bus_share == 0 || n <= 0 ? 1.0 : double(bus_share) * double(n - 1) / double(n);
  }
};

/// The list, in the enum's order.
inline constexpr collective_traits collectives[] = {
    {collective::all_reduce, "all_reduce", true, false, false, 2, "2(n-1)/n"},
    {collective::reduce_scatter, "reduce_scatter", true, true, false, 1, "(n-1)/n"},
    {collective::all_gather, "all_gather", false, true, false, 1, "(n-1)/n"},
    {collective::broadcast, "broadcast", false, false, true, 0, "1"},
    {collective::reduce, "reduce", true, false, true, 0, "1"},
    {collective::all_to_all, "all_to_all", false, true, false, 1, "(n-1)/n"},
};
inline constexpr std::size_t kCollectives = std::size(collectives);

static_assert([] {
  for (std::size_t i = 0; i < kCollectives; ++i)
    if (std::size_t(collectives[i].id) != i) return false;
  return true;
}(), "collx: algo::collectives must list the collectives in algo::collective's order");

constexpr const collective_traits& traits(collective c) noexcept { return collectives[std::size_t(c)]; }

/// Calls f(traits) for every collective, in the list's order.
template <class F>
constexpr void for_each_collective(F&& f) {
  for (const auto& t : collectives) f(t);
}

inline std::optional<collective> parse_collective(std::string_view s) noexcept {
  for (const auto& t : collectives)
    if (s == t.name) return t.id;
  return std::nullopt;
}

}  // namespace collx::algo
