#pragma once
// Which ranks of a communicator share a node: the map a two-level communicator is built on
// (transport/two_level.hpp) and a two-level policy reads (algo/two_level.hpp).
//
// Nodes are numbered in the order of their lowest rank, and a node's ranks ascend: local rank l
// of node j is members[j][l]. Nodes need not be even (3 ranks on one, 2 on another) nor their
// ranks consecutive (a launcher that numbers ranks round-robin across hosts).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace collx {

struct node_map {
  std::vector<int> node_of;               // per rank: its node
  std::vector<int> local_of;              // per rank: its place among its node's ranks
  std::vector<std::vector<int>> members;  // per node: its ranks, ascending

  int size() const noexcept { return int(node_of.size()); }
  int nodes() const noexcept { return int(members.size()); }
  /// The most ranks any node has.
  int widest() const noexcept {
    std::size_t w = 0;
    for (const auto& m : members) w = std::max(w, m.size());
    return int(w);
  }
  bool same_node(int a, int b) const noexcept { return node_of[std::size_t(a)] == node_of[std::size_t(b)]; }
  /// Whether every node holds one rank, or one node holds every rank: nothing for two levels to do.
  bool flat() const noexcept { return members.size() <= 1 || members.size() == node_of.size(); }

  /// The map of n ranks whose node keys are `key(r)` (a host name's hash, COLLX_NODE's value):
  /// equal keys share a node.
  template <class Key>
  static node_map from_keys(int n, Key&& key) {
    node_map m;
    m.node_of.assign(std::size_t(n), -1);
    m.local_of.assign(std::size_t(n), 0);
    std::vector<decltype(key(0))> keys;
    for (int r = 0; r < n; ++r) {
      const auto k = key(r);
      const auto at = std::find(keys.begin(), keys.end(), k);
      const int j = int(at - keys.begin());
      if (at == keys.end()) {
        keys.push_back(k);
        m.members.emplace_back();
      }
      m.node_of[std::size_t(r)] = j;
      m.local_of[std::size_t(r)] = int(m.members[std::size_t(j)].size());
      m.members[std::size_t(j)].push_back(r);
    }
    return m;
  }
  /// One node of every one of n ranks (a transport that knows of no nodes).
  static node_map one_node(int n) { return of_sizes(std::vector<int>(1, n)); }
  /// One node per group of `sizes[j]` ranks, numbered node by node (`round_robin`: rank r on
  /// the node r mod nodes among those with room, as launchers that deal ranks out do).
  static node_map of_sizes(const std::vector<int>& sizes, bool round_robin = false) {
    int n = 0;
    for (int s : sizes) n += s;
    std::vector<int> at(static_cast<std::size_t>(n));
    if (!round_robin) {
      int r = 0;
      for (std::size_t j = 0; j < sizes.size(); ++j)
        for (int i = 0; i < sizes[j]; ++i) at[std::size_t(r++)] = int(j);
    } else {
      std::vector<int> room(sizes);
      int r = 0;
      while (r < n)
        for (std::size_t j = 0; j < sizes.size() && r < n; ++j)
          if (room[j] > 0) {
            --room[j];
            at[std::size_t(r++)] = int(j);
          }
    }
    return from_keys(n, [&](int r) { return at[std::size_t(r)]; });
  }
  /// The map of the ranks `keep` (ranks here, in their new order): a split's.
  node_map restricted(const std::vector<int>& keep) const {
    return from_keys(int(keep.size()), [&](int r) { return node_of[std::size_t(keep[std::size_t(r)])]; });
  }

  /// "2 nodes: 0-1 | 2-4" style, one node after another: "node 0: ranks 0, 2; node 1: ranks 1, 3".
  std::string describe() const {
    std::string s;
    for (std::size_t j = 0; j < members.size(); ++j) {
      s += (j ? "; node " : "node ") + std::to_string(j) + ": rank" + (members[j].size() == 1 ? " " : "s ");
      for (std::size_t i = 0; i < members[j].size(); ++i) s += (i ? ", " : "") + std::to_string(members[j][i]);
    }
    return s;
  }
};

}  // namespace collx
