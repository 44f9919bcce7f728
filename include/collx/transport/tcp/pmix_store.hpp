#pragma once
// The rendezvous store a PMIx launcher keeps for its job: Open MPI's mpirun, srun --mpi=pmix,
// PRRTE's prterun. Under one of them tcp::from_env (and so two_level<shm, tcp>::from_env) needs
// no MASTER_ADDR: each rank publishes what it must (PMIx_Put of its
// own keys, PMIx_Commit), and reads a peer's key from that peer (PMIx_Get of (namespace, rank)):
// the launcher's servers carry it between hosts (PMIx's direct modex: a get waits for the
// peer's commit, however far it is). A rendezvous that all ranks reach at one point could read
// everything after one PMIx_Fence; collx's is incremental (rank 0's secret and session first,
// then each rank's address, which it publishes only once it listens), so a get asks for one
// key of one rank and polls, with its own deadline, until that rank has committed it.
//
// PMIx is a private channel: only the job's processes, authenticated by the launcher's server
// (as this user), read what they put. So with no secret given, rank 0 draws one and puts it
// there (tcp/secret.hpp, 3b), and the rendezvous needs nothing from the user.
//
// Only programs built with it have it: the CMake target collx::pmix defines COLLX_WITH_PMIX and
// links libpmix (Debian's libpmix-dev); the rest of collx never needs PMIx.
#include <pmix.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "../../core/error.hpp"
#include "socket.hpp"
#include "store.hpp"

namespace collx::transport {

/// An address of this host's that routes toward the launcher (mpirun's, or srun's host), for a
/// job whose store is the launcher's: its ranks listen there, on the network the launcher
/// reached them over; else the address this host's name resolves to. Empty when none of those
/// is more than a loopback address (then the ranks listen on 127.0.0.1: one host).
inline std::string launcher_route_address() {
  std::vector<std::string> cands;
  // mpirun: "jobid.vpid;tcp://A,B:port;tcp6://[...]:port"
  if (const char* uri = std::getenv("OMPI_MCA_orte_hnp_uri")) {
    const std::string u = uri;
    for (std::size_t at = u.find("tcp://"); at != std::string::npos; at = u.find("tcp://", at + 1)) {
      const std::size_t b = at + 6, e = u.find(':', b);
      if (e == std::string::npos) break;
      std::string list = u.substr(b, e - b);
      for (std::size_t s = 0; s <= list.size();) {
        const std::size_t c = std::min(list.find(',', s), list.size());
        if (c > s) cands.push_back(list.substr(s, c - s));
        s = c + 1;
      }
    }
  }
  if (const char* a = std::getenv("SLURM_LAUNCH_NODE_IPADDR")) cands.emplace_back(a);
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) cands.emplace_back(host);  // its own address: routes to itself
  std::string loopback;
  for (const std::string& c : cands) {
    try {
      const net::address to = net::resolve(c, 1);
      const net::address me = net::route_to(to);
      if (!me.is_loopback()) return c;
      if (loopback.empty()) loopback = c;  // the launcher is on this host
    } catch (const std::exception&) {
    }
  }
  return loopback;
}

/// The launcher's PMIx store (tcp/store.hpp's interface). Each pmix_store a process makes is its
/// next communicator's: the ranks make theirs in the same order, so their keys meet.
class pmix_store final : public store {
 public:
  /// `rank`: this process's rank in the job, as the launcher's variables say; PMIx must agree.
  explicit pmix_store(int rank) {
    const pmix_status_t rc = PMIx_Init(&me_, nullptr, 0);
    if (rc != PMIX_SUCCESS)
      throw error(errc::transport_error, std::string("tcp: PMIx_Init failed (") + PMIx_Error_string(rc) +
                                             "): the launcher set PMIX_NAMESPACE but serves no PMIx this process can reach");
    if (int(me_.rank) != rank) {
      PMIx_Finalize(nullptr, 0);
      throw error(errc::invalid_argument, "tcp: PMIx says this process is rank " + std::to_string(me_.rank) + " of namespace " +
                                              me_.nspace + ", the launcher's variables say rank " + std::to_string(rank) +
                                              ": rank numbers that differ cannot meet in PMIx (unset COLLX_RANK, or set MASTER_ADDR)");
    }
    prefix_ = "collx." + std::to_string(next_use()) + ".";
  }
  ~pmix_store() override { PMIx_Finalize(nullptr, 0); }
  pmix_store(const pmix_store&) = delete;
  pmix_store& operator=(const pmix_store&) = delete;

  void set(const std::string& key, const std::string& value) override {
    const std::string k = full(key);
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_STRING;
    v.data.string = const_cast<char*>(value.c_str());  // PMIx_Put copies it
    pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, k.c_str(), &v);
    if (rc == PMIX_SUCCESS) rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS) fail("PMIx_Put/PMIx_Commit of " + k, rc);
  }

  /// Rank 0's value of `key` (a key of the job's: rank 0 sets those).
  std::optional<std::string> get(const std::string& key, net::clock::time_point deadline) override { return get_from(0, key, deadline); }

  std::optional<std::string> get_from(int setter, const std::string& key, net::clock::time_point deadline) override {
    const std::string k = full(key);
    pmix_proc_t p;
    PMIX_LOAD_PROCID(&p, me_.nspace, pmix_rank_t(setter));
    for (useconds_t nap = 1000;;) {
      // PMIx's own timeout is whole seconds: a get waits at most that for a peer that has
      // committed nothing yet; one that has, but not this key, answers "not found" at once
      // (the cache refreshed each time, so a later commit is seen).
      const auto left = std::chrono::duration_cast<std::chrono::seconds>(deadline - net::clock::now()).count();
      int secs = int(std::clamp<long long>(left + 1, 1, 5));
      bool refresh = true;
      pmix_info_t info[2];
      PMIX_INFO_LOAD(&info[0], PMIX_GET_REFRESH_CACHE, &refresh, PMIX_BOOL);
      PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &secs, PMIX_INT);
      pmix_value_t* v = nullptr;
      const pmix_status_t rc = PMIx_Get(&p, k.c_str(), info, 2, &v);
      PMIX_INFO_DESTRUCT(&info[0]);
      PMIX_INFO_DESTRUCT(&info[1]);
      if (rc == PMIX_SUCCESS) {
        std::string s = v != nullptr && v->type == PMIX_STRING && v->data.string != nullptr ? v->data.string : "";
        if (v != nullptr) PMIX_VALUE_RELEASE(v);
        return s;
      }
      if (rc != PMIX_ERR_NOT_FOUND && rc != PMIX_ERR_TIMEOUT && rc != PMIX_ERR_PROC_ENTRY_NOT_FOUND)
        fail("PMIx_Get of " + k + " from rank " + std::to_string(setter), rc);
      if (net::clock::now() >= deadline) return std::nullopt;
      ::usleep(nap);
      nap = std::min<useconds_t>(nap * 2, 20000);
    }
  }

  std::int64_t add(const std::string& key, std::int64_t) override {
    throw error(errc::invalid_argument, "tcp: the PMIx store keeps no counters (" + full(key) + ")");
  }
  std::string where() const override { return std::string("PMIx (namespace ") + me_.nspace + ")"; }
  bool launcher_kept() const override { return true; }

 private:
  static int next_use() {
    static std::atomic<int> uses{0};
    return uses.fetch_add(1);
  }
  std::string full(const std::string& key) const {
    std::string k = prefix_ + key;
    if (k.size() >= PMIX_MAX_KEYLEN)
      throw error(errc::invalid_argument, "tcp: PMIx key \"" + k + "\" is longer than PMIx allows (" + std::to_string(PMIX_MAX_KEYLEN) + ")");
    return k;
  }
  [[noreturn]] void fail(const std::string& what, pmix_status_t rc) const {
    throw error(errc::transport_error, "tcp: " + what + " (rank " + std::to_string(me_.rank) + ", namespace " + me_.nspace +
                                           ") failed: " + PMIx_Error_string(rc));
  }

  pmix_proc_t me_{};
  std::string prefix_;
};

}  // namespace collx::transport
