#pragma once
// What communicator::split (features/groups.hpp) hands a transport to make the new communicator's: every
// member agrees on the plan, which one small all_gather on the parent produced.
//
// A transport that can split supplies
//   split_offer prepare_split();                        before the all_gather: what it brings
//   T split(const split_plan&, split_offer&&);          after it: the new communicator's transport
// Each communicator gets channels of its own (inproc: a group of its own; shm: a segment of the
// new communicator's size; tcp: a connection between each pair of its ranks), so its messages
// never meet another communicator's, whatever runs at the same time.
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace collx {

/// What a rank brings to a split besides its color and key: whatever its transport needs to
/// connect the new communicator's ranks (tcp: the address it listens on for them).
struct split_offer {
  static constexpr std::size_t kBlob = 112;
  std::array<char, kBlob> blob{};
  std::shared_ptr<void> keep;  // what the blob refers to (a listening socket), until the split is made
};

struct split_plan {
  std::string id;                   // unique among the job's communicators; the same on every member
  int rank = 0, size = 1;           // this rank's place in the new communicator, and its size
  std::vector<int> members;         // the members' ranks on the parent, in the new order
  std::vector<std::array<char, split_offer::kBlob>> offers;  // each member's blob, in the new order
  std::chrono::nanoseconds timeout{};  // the parent's options::timeout
};

/// What communicator::shrink (features/groups.hpp) asks of a transport that can shrink, which supplies
///   T shrink(const shrink_request&, std::vector<int>& members);
/// The ranks still alive agree, through what the failure left of the transport, on who they
/// are (shm: the segment, where a dead rank's liveness mutex is free; tcp: each rank's listening
/// socket, which refuses connections once its process is gone; inproc: the group), and a rank
/// that has not joined by the deadline is counted lost. `members` gets the survivors (ranks of
/// this communicator, ascending) and the result is the new communicator's transport, its rank i
/// being members[i]. A rank the others decided without fails with errc::peer_lost.
struct shrink_request {
  std::uint32_t epoch = 1;             // this communicator's shrinks so far, this one included
  std::string id;                      // the new communicator's id (as split_plan::id)
  std::chrono::nanoseconds timeout{};  // how long the survivors wait for each other
  std::string what;                    // "shrink #1 of the job's communicator on rank 3": for messages
};

namespace detail {
/// The group of a communicator split from `parent` (split_plan::id), for transports whose
/// ranks are threads of one process (inproc's, cuda's): every member asks for it, the first
/// makes it (`make()`), the last takes it out of the registry.
template <class G, class Make>
std::shared_ptr<G> join_split_group(const G* parent, const split_plan& p, Make make) {
  struct entry {
    std::shared_ptr<G> g;
    int joined = 0;
  };
  static std::mutex mu;
  static std::map<std::pair<const G*, std::string>, entry> registry;
  std::lock_guard lk(mu);
  const auto key = std::pair{parent, p.id};
  entry& e = registry[key];
  if (!e.g) {
    try {
      e.g = make();
    } catch (...) {
      registry.erase(key);
      throw;
    }
  }
  std::shared_ptr<G> g = e.g;
  if (++e.joined == p.size) registry.erase(key);
  return g;
}
}  // namespace detail

}  // namespace collx
