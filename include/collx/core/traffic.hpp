#pragma once
// What a rank sent, received and reduced: transport::counting records it (transport/counting.hpp),
// the cost model derives it from a schedule (algo/model.hpp), and the tests compare the two.
#include <cstdint>

namespace collx::transport {

struct traffic {
  std::uint64_t steps = 0;              // exchange calls that moved at least one message
  std::uint64_t messages_sent = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t messages_received = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t bytes_reduced = 0;      // received bytes that were combined with local data
  friend bool operator==(const traffic&, const traffic&) = default;
};

}  // namespace collx::transport
