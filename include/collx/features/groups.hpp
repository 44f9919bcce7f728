#pragma once
// communicator::split (MPI_Comm_split, ncclCommSplit) and mesh(), which splits a job laid out as
// a d1 x d2 x ... grid into one communicator per dimension (torch's DeviceMesh), and
// communicator::shrink (ncclCommShrink), the survivors' communicator after a failure.
//
// A split is one all_gather on the parent of a 120-byte entry per rank: its color, its key and
// its transport's offer (core/split_plan.hpp). Every rank then knows every group, and the members of
// each make their transport's channels among themselves (no store, no new rendezvous): a
// communicator costs, per rank, a share of a shared-memory segment of its size over shm
// (shm::footprint(m) / m, ~1.1 MiB with the defaults), m - 1 sockets over tcp, and a group of
// m x m channels in the process over threads. A rank that passes collx::no_color takes part in
// the all_gather and gets a null communicator.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "../collectives/all_gather.hpp"
#include "../comm/communicator.hpp"
#include "../core/split_plan.hpp"

namespace collx {

namespace detail {
struct split_entry {
  std::int32_t color;
  std::int32_t key;
  std::array<char, split_offer::kBlob> blob;
};
static_assert(sizeof(split_entry) == 120);
}  // namespace detail

template <class T>
communicator<T> communicator<T>::split(int color, int key, const std::string& name) {
  static_assert(requires(T& t, const split_plan& p, split_offer&& o) {
                  { t.prepare_split() } -> std::same_as<split_offer>;
                  { t.split(p, std::move(o)) } -> std::same_as<T>;
                },
                "collx: this transport cannot split: it needs `split_offer prepare_split()` and "
                "`T split(const split_plan&, split_offer&&)` (core/split_plan.hpp)");
  const detail::call_queue::turn turn(detail::queue_of(*this, "split"), "split");
  split_offer offer = transport().prepare_split();
  detail::split_entry mine{std::int32_t(color), std::int32_t(key), offer.blob};
  // (all[rank] is this rank's entry: an all_gather in place, on any transport's memory)
  std::vector<detail::split_entry> all(static_cast<std::size_t>(size()));
  all[std::size_t(rank())] = mine;
  detail::on_transport_memory(*this, reinterpret_cast<std::byte*>(all.data()), all.size() * sizeof(detail::split_entry), [&](std::byte* p) {
    auto* e = reinterpret_cast<detail::split_entry*>(p);
    all_gather(*this, std::span<const detail::split_entry>(e + rank(), 1), std::span<detail::split_entry>(e, all.size()), algo::ring{});
  });
  const std::uint32_t index = ++splits();
  // Every rank has every entry, so every rank finds a bad color and fails alike.
  for (int r = 0; r < size(); ++r)
    if (all[std::size_t(r)].color < 0 && all[std::size_t(r)].color != no_color)
      throw error(errc::invalid_argument, "split #" + std::to_string(index) + (name.empty() ? "" : " (" + name + ")") +
                                              (identity().is_job() ? "" : " of communicator " + identity().name) + ": " +
                                              identity().rank_name(r) + " passed color " +
                                              std::to_string(all[std::size_t(r)].color) +
                                              " (a color is >= 0, or collx::no_color to join none)");
  if (color == no_color) return communicator{};
  std::vector<int> members;
  for (int r = 0; r < size(); ++r)
    if (all[std::size_t(r)].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[std::size_t(a)].key < all[std::size_t(b)].key; });  // ties: parent rank
  split_plan plan;
  plan.id = (s_->id.is_job() ? std::string() : s_->uid + ".") + "s" + std::to_string(index) + "c" + std::to_string(color);
  plan.size = int(members.size());
  plan.rank = int(std::find(members.begin(), members.end(), rank()) - members.begin());
  plan.members = members;
  for (int m : members) plan.offers.push_back(all[std::size_t(m)].blob);
  return child_of(std::move(plan), std::move(offer), name);
}

template <class T>
communicator<T> communicator<T>::child_of(split_plan plan, split_offer&& offer, const std::string& name) {
  plan.timeout = opts().timeout;
  try {
    return adopt(transport().split(plan, std::move(offer)), plan.id, plan.members, name);
  } catch (const std::exception& e) {
    // A failure of the transport's own (a member that died before attaching, a full
    // /dev/shm) is this rank's last failed call too: a shrink's revoke, or the communicator's
    // end, tells peers this cause (the chaos run found a revoke that named no dead rank).
    detail::note_last_error(e.what());
    throw;
  }
}

template <class T>
communicator<T> communicator<T>::adopt(T t, const std::string& uid, const std::vector<int>& members, const std::string& name) {
  comm_identity id;
  id.name = name.empty() ? uid : name;
  for (int m : members) id.job_ranks.push_back(job_rank(m));
  id.hash = detail::fnv1a(uid) | 1;  // never 0 (the job's own)
  communicator child = make_child(std::move(t), std::move(id));
  child.s_->uid = uid;
  return child;
}

template <class T>
communicator<T> communicator<T>::shrink(const std::string& name) {
  static_assert(requires(T& t, const shrink_request& q, std::vector<int>& m) {
                  { t.shrink(q, m) } -> std::same_as<T>;
                },
                "collx: this transport cannot shrink: it needs `T shrink(const shrink_request&, std::vector<int>&)` (core/split_plan.hpp)");
  const detail::call_queue::turn turn(detail::queue_of(*this, "shrink"), "shrink");
  shrink_request q;
  q.epoch = ++s_->shrinks;
  q.id = (s_->id.is_job() ? std::string() : s_->uid + ".") + "k" + std::to_string(q.epoch);
  q.timeout = opts().timeout;
  const std::string of = identity().is_job() ? std::string("the job's communicator") : "communicator " + identity().name;
  q.what = "shrink #" + std::to_string(q.epoch) + " of " + of + " on " + identity().rank_name(rank());
  // Revoked first (MPI_Comm_revoke): ranks still in a call on it, waiting for this one, fail
  // now and come to the shrink, instead of at their deadline, when the others may have
  // decided without them.
  const std::string why = q.what + " revoked it" +
                          (detail::tl_last_error.empty() ? std::string() : " (this rank's last failed call: " + detail::tl_last_error + ")");
  transport().abort(why);
  // And the communicators made from it (a data-parallel group split from the job's): a peer
  // blocked in one of them, waiting for this rank, comes to the shrink too.
  revoke_children(why);
  std::vector<int> members;
  const auto began = std::chrono::steady_clock::now();
  T t = [&] {
    try {
      return transport().shrink(q, members);
    } catch (const std::exception& e) {
      detail::note_last_error(e.what());  // as child_of's
      throw;
    }
  }();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  if (s_->dbg.on(debug_level::info)) {
    std::string lost;
    for (int r = 0, k = 0; r < size(); ++r) {
      if (k < int(members.size()) && members[std::size_t(k)] == r) ++k;
      else lost += (lost.empty() ? "" : ", ") + identity().rank_name(r);
    }
    char took[48];
    std::snprintf(took, sizeof took, " (%.1f ms)", ms);
    s_->dbg.write(debug_level::info, q.what + ": " + std::to_string(members.size()) + " of " + std::to_string(size()) +
                                         " ranks went on" + (lost.empty() ? std::string() : "; lost: " + lost) + took);
  }
  return adopt(std::move(t), q.id, members, name);
}

template <class T>
template <class Agree>
communicator<T> communicator<T>::create_group(const std::vector<int>& members, const std::string& id, Agree&& agree,
                                              const std::string& name) {
  const detail::call_queue::turn turn(detail::queue_of(*this, "create_group"), "create_group");
  const auto me = std::find(members.begin(), members.end(), rank());
  std::vector<int> seen(static_cast<std::size_t>(size()), 0);
  for (int m : members)
    if (m < 0 || m >= size() || seen[std::size_t(m)]++ != 0)
      throw error(errc::invalid_argument, "create_group " + (name.empty() ? id : name) + (identity().is_job() ? "" : " of communicator " + identity().name) +
                                              ": member " + std::to_string(m) + " is out of range for " + std::to_string(size()) +
                                              " ranks or listed twice");
  if (me == members.end())
    throw error(errc::invalid_argument, "create_group " + (name.empty() ? id : name) + ": " + identity().rank_name(rank()) +
                                            " is not one of its members (only members call it)");
  if (id.empty()) throw error(errc::invalid_argument, "create_group: the id must not be empty");
  split_offer offer = transport().prepare_split();
  const std::vector<std::array<char, split_offer::kBlob>> offers = agree(offer.blob);
  if (offers.size() != members.size())
    throw error(errc::invalid_argument, "create_group " + (name.empty() ? id : name) + ": agree() returned " +
                                            std::to_string(offers.size()) + " offers for " + std::to_string(members.size()) + " members");
  split_plan plan;
  plan.id = (s_->id.is_job() ? std::string() : s_->uid + ".") + "g" + id;
  plan.size = int(members.size());
  plan.rank = int(me - members.begin());
  plan.members = members;
  plan.offers = offers;
  return child_of(std::move(plan), std::move(offer), name);
}

/// The communicators of a job laid out row-major as a dims[0] x dims[1] x ... grid (the last
/// dimension varies fastest: DP x TP puts a TP group on consecutive ranks): element k holds the
/// ranks that differ from this one in coordinate k only, ranked by that coordinate. A collective
/// call on comm, whose size must be the product of dims. `names` name them in messages.
template <class T>
std::vector<communicator<T>> mesh(communicator<T>& comm, const std::vector<int>& dims,
                                  const std::vector<std::string>& names = {}) {
  long long total = 1;
  for (int d : dims) {
    if (d < 1) throw error(errc::invalid_argument, "mesh: every dimension must be at least 1, got " + std::to_string(d));
    total *= d;
  }
  if (dims.empty() || total != comm.size())
    throw error(errc::invalid_argument, "mesh: " + std::to_string(comm.size()) + " ranks cannot be laid out as a grid of " +
                                            std::to_string(total) + " ranks");
  std::vector<int> coord(dims.size());
  for (int r = comm.rank(), k = int(dims.size()) - 1; k >= 0; --k) {
    coord[std::size_t(k)] = r % dims[std::size_t(k)];
    r /= dims[std::size_t(k)];
  }
  std::vector<communicator<T>> out;
  for (std::size_t k = 0; k < dims.size(); ++k) {
    int color = 0;  // the other coordinates, row-major
    for (std::size_t j = 0; j < dims.size(); ++j)
      if (j != k) color = color * dims[j] + coord[j];
    out.push_back(comm.split(color, coord[k], k < names.size() ? names[k] : std::string()));
  }
  return out;
}

}  // namespace collx
