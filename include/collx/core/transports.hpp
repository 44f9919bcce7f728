#pragma once
// The one list of transports: what each is called, what its ranks are, and the cost model's
// shipped parameters for it. Everything that takes a transport by name reads it here: the cost
// model's calibration (algo/calibration.hpp), launching ranks by name (launch/named.hpp),
// collx-perf's and collx-explain's --transport, and the torch backend's COLLX_TORCH_TRANSPORT.
// A transport is its file (its class's `name` is the key below) plus one line here.
#include <array>
#include <string>
#include <string_view>

namespace collx {

/// What a transport's ranks are.
enum class rank_kind : unsigned char {
  threads,    // threads of one process
  processes,  // processes of one host
  hosts,      // processes anywhere they can reach each other
  device,     // GPUs (the ranks' memory is device memory)
  mpi,        // processes an MPI launcher started, over MPI (its own header: not launched by name)
};

struct transport_entry {
  std::string_view name;   // the class's `name` (transport::shm::name): calibration files use it
  std::string_view flag;   // what --transport and COLLX_TORCH_TRANSPORT take (usually the name)
  std::string_view words;  // how a table says it: "processes over shared memory"
  rank_kind ranks;
  // The cost model's shipped α (s per step), β (s per byte), γ (s per byte reduced): measured
  // on the development machine (2 cores, Debian 12, 2 ranks, `collx-perf --calibrate
  // --transport T`) where the transport runs there; estimated for the GPU transports
  // (algo/calibration.hpp says how). A machine's own calibration is better.
  double alpha, beta, gamma;
};

inline constexpr std::array kTransports{
    transport_entry{"inproc", "threads", "threads of this process", rank_kind::threads, 6.1e-6, 1.2e-10, 1.2e-10},
    transport_entry{"shm", "shm", "processes over shared memory", rank_kind::processes, 2.1e-7, 7.3e-11, 1.2e-10},
    transport_entry{"tcp", "tcp", "processes over tcp", rank_kind::hosts, 4.0e-6, 4.5e-10, 1.2e-10},
    // mpi's are estimated, not measured yet: Open MPI's shared memory path on the development
    // machine (ob1 over vader: a small message's round trip ~1 us, CMA single copy); a network's
    // are the machine's own calibration's to give
    transport_entry{"mpi", "mpi", "processes over MPI", rank_kind::mpi, 2.0e-6, 1.5e-10, 1.2e-10},
    transport_entry{"cuda", "cuda", "thread-ranks on GPUs of this process", rank_kind::device, 2.0e-6, 5.0e-13, 2.5e-13},
    transport_entry{"cuda-ipc", "cuda-ipc", "processes on GPUs of one host", rank_kind::device, 8.0e-6, 2.2e-12, 2.5e-13},
};

/// The transport called `name` (its name or its flag), or nullptr.
constexpr const transport_entry* find_transport(std::string_view name) noexcept {
  for (const transport_entry& t : kTransports)
    if (t.name == name || t.flag == name) return &t;
  return nullptr;
}

/// The flags of the transports whose ranks are one of `kinds`, as "a, b or c" (for messages).
template <class... K>
std::string transport_flags(K... kinds) {
  std::string s, last;
  for (const transport_entry& t : kTransports) {
    if (!((t.ranks == kinds) || ...)) continue;
    if (!last.empty()) s += (s.empty() ? "" : ", ") + last;
    last = "'" + std::string(t.flag) + "'";
  }
  return s.empty() ? last : s + " or " + last;
}

}  // namespace collx
