#pragma once
// The analysis of the wait tables: who the group's stragglers are. Part of comm/flight.hpp, which includes it
// after the recorder; include comm/flight.hpp, not this file.

namespace collx {

namespace flight {

/// The rank of a group that its peers' waits blame, when one stands out: given per rank the
/// wait the others' tables blame on it (`late`, wait_table::late_ns summed over the group) and
/// its time in calls (`busy`), the rank whose blame is over half the group's, at least three
/// times the next rank's, at least a fifth of the median time in calls and at least 1 ms; -1
/// when none is (noise: on a crowded host every rank is a little late now and then).
/// collx-perf --waits and collx-trace mark a straggler by this rule.
inline int straggler(const std::vector<std::int64_t>& late, const std::vector<std::int64_t>& busy) {
  std::int64_t total = 0, best = 0, second = 0;
  int who = -1;
  for (std::size_t r = 0; r < late.size(); ++r) {
    total += late[r];
    if (late[r] > best) {
      second = best;
      best = late[r];
      who = int(r);
    } else if (late[r] > second) {
      second = late[r];
    }
  }
  std::vector<std::int64_t> b = busy;
  std::sort(b.begin(), b.end());
  const std::int64_t median = b.empty() ? 0 : b[b.size() / 2];
  const bool stands_out = best >= 1'000'000 && 2 * best > total && best >= 3 * second && 5 * best >= median;
  return who >= 0 && stands_out ? who : -1;
}

}  // namespace flight

}  // namespace collx
