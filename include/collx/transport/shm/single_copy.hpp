#pragma once
// transport::shm's single-copy receive: a large message is read straight from the sender's
// memory (process_vm_readv) instead of through the segment's slots. Part of shm.hpp, which
// includes it after the class; include shm.hpp, not this file.

namespace collx::transport {

inline void shm::read_remote(channel_ctl& c, const recv_desc& d, std::uint64_t addr, const call_info& call, const combiner& comb, std::size_t elem) {
  c.reading.store(1, std::memory_order_seq_cst);
  struct lower {
    channel_ctl& c;
    ~lower() { c.reading.store(0, std::memory_order_seq_cst); }
  } guard{c};
  if (rc(d.peer).state.load(std::memory_order_seq_cst) == shm_layout::kFailed) report_gone(d.peer, call);
  const pid_t pid = rc(d.peer).pid;
  auto read = [&](std::byte* to, std::uint64_t from, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      iovec local{to + got, n - got}, remote{reinterpret_cast<void*>(from + got), n - got};
      const ssize_t k = process_vm_readv(pid, &local, 1, &remote, 1, 0);
      if (k <= 0) {
        if (k < 0 && errno == EINTR) continue;
        if (peer_gone(d.peer)) report_gone(d.peer, call);
        call.fail(errc::transport_error, "could not read " + call.peer(d.peer) +
                                             "'s buffer (process_vm_readv): " + std::strerror(errno));
      }
      got += std::size_t(k);
    }
  };
  if (d.how == combine::copy && !d.spread()) {
    read(d.dst, addr, d.bytes);
  } else {
    const std::size_t piece = std::max(elem, kBounceBytes / elem * elem);
    if (bounce_.size() < piece) bounce_.resize(piece);
    for (std::size_t off = 0; off < d.bytes; off += piece) {
      const std::size_t nb = std::min(piece, d.bytes - off);
      read(bounce_.data(), addr + off, nb);
      detail::deliver(d, off, bounce_.data(), nb, comb);
    }
  }
  if (rc(d.peer).state.load(std::memory_order_seq_cst) == shm_layout::kFailed) report_gone(d.peer, call);
}

}  // namespace collx::transport
