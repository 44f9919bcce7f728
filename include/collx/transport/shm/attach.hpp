#pragma once
// transport::shm joining its job and leaving it: rank 0 replaces what a crashed run left,
// creates the segment and reserves every page of it (shm/segment.hpp); the other ranks wait for
// it, letting go of a stale one; every rank then publishes its liveness (shm/liveness.hpp) and
// probes whether it may read its peers' memory. Part of shm.hpp, which includes it after the
// class; include shm.hpp, not this file.

namespace collx::transport {

inline void shm::attach(const members_of* from) {
  using namespace shm_layout;
  const auto deadline = std::chrono::steady_clock::now() + cfg_.attach_timeout;
  if (rank_ == 0) create(deadline);
  else join(deadline, from);
  rank_ctl& m = me();
  keeper_->hold(&m.alive);
  m.pid = std::int32_t(getpid());
  m.base = reinterpret_cast<std::uintptr_t>(base_);
  if (sched_getaffinity(0, sizeof m.cpus, &m.cpus) != 0) CPU_ZERO(&m.cpus);
  m.state.store(kLive);
  left_ = false;
  pool_.reset(n_, L_.slots);
  if (rank_ == 0) hdr().magic.store(kMagic, std::memory_order_release);  // now others may join
  hdr().attached.fetch_add(1, std::memory_order_seq_cst);
  for (int q = 0; q < n_; ++q) rc(q).doorbell.wake(true);
  // Everyone attached (a member's state is published once it has): the name is no longer
  // needed, so nothing can leak into /dev/shm. A member that is gone before it attached will
  // never come, and every member gives up (so does one the creator's loss strands in join). One
  // that attached and then died is waited past: the others all complete (giving up here would
  // let some complete and not others), and their first call finds it.
  auto all_attached = [&] {
    for (int q = 0; q < n_; ++q)
      if (rc(q).state.load(std::memory_order_seq_cst) == 0) return false;
    return true;
  };
  while (!all_attached()) {
    if (from != nullptr) {
      if (const int k = from->gone(this); k >= 0) {
        unlink_own();
        fail_gone(*from, k, "before it attached");
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::string missing;
      for (int q = 0; q < n_; ++q)
        if (rc(q).state.load() == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
      unlink_own();
      give_up(errc::timeout, who() + " timed out waiting for rank(s) " + missing + " to attach");
    }
    const std::uint32_t v = me().doorbell.word.load();
    if (!all_attached()) detail::futex_wait(me().doorbell.word, v, std::chrono::milliseconds(10), true);
  }
  if (rank_ == 0) unlink_own();  // its creator (docs/security.md)
  cpu_set_t job;
  CPU_ZERO(&job);
  for (int q = 0; q < n_; ++q) CPU_OR(&job, &job, &rc(q).cpus);
  spin_ = detail::spin_for(n_, std::max(1, CPU_COUNT(&job)));
  probe_single_copy(deadline);
}

/// Throws, naming the segment, its owner and the fix, unless `st` (the segment's) is this user's
/// and grants group and others nothing: collx never joins, nor replaces, another user's segment.
inline void shm::check_owner(const struct stat& st) const {
  if (st.st_uid == ::geteuid() && (st.st_mode & 077) == 0) return;
  std::string owner = "uid " + std::to_string(st.st_uid);
  if (const passwd* pw = ::getpwuid(st.st_uid); pw != nullptr && pw->pw_name != nullptr) owner += " (" + std::string(pw->pw_name) + ")";
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
  throw error(errc::invalid_argument,
              who() + ": the segment /dev/shm" + name_ + " belongs to " + owner + ", mode " + mode + ", not to this user (uid " +
                  std::to_string(::geteuid()) + ") alone: it was made by someone else under this job's name, and collx never joins "
                  "or replaces it. Have its owner remove it, give the job another name (COLLX_JOB), or set COLLX_JOB_TOKEN, which "
                  "makes the name one that others cannot know in advance (docs/security.md)");
}

/// The segment's name exists but this user may not open it (EACCES): its owner, named.
inline void shm::check_name_owner() const {
  struct stat st {};
  if (::stat(("/dev/shm" + name_).c_str(), &st) == 0) check_owner(st);
  throw error(errc::invalid_argument, who() + ": the segment " + name_ + " exists, and this user may not open it (another user's?): "
                                          "collx never joins it; give the job another name (COLLX_JOB) or set COLLX_JOB_TOKEN");
}

/// Unlinks the segment's name if it still names the segment this rank mapped (not a later
/// run's, not another user's).
inline void shm::unlink_own() noexcept {
  const int f = shm_open(name_.c_str(), O_RDONLY, 0);
  if (f < 0) return;
  struct stat st {};
  const bool same = fstat(f, &st) == 0 && st.st_ino == ino_ && st.st_dev == dev_;
  ::close(f);
  if (same) shm_unlink(name_.c_str());
}

inline bool shm::creator_alive(std::byte* base) {
  auto& r0 = *reinterpret_cast<rank_ctl*>(base + shm_layout::layout::ranks_off());
  for (int tries = 0;; ++tries) {
    if (r0.state.load(std::memory_order_acquire) != shm_layout::kLive) return false;
    const int r = pthread_mutex_trylock(&r0.alive);
    if (r == EBUSY) {
      if (tries >= 2) return true;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    if (r == EOWNERDEAD) pthread_mutex_consistent(&r0.alive);
    std::uint32_t live = shm_layout::kLive;
    r0.state.compare_exchange_strong(live, shm_layout::kFailed);
    if (r == 0 || r == EOWNERDEAD) pthread_mutex_unlock(&r0.alive);
    return false;
  }
}

inline void shm::create(std::chrono::steady_clock::time_point deadline) {
  using namespace shm_layout;
  const std::size_t bytes = L_.total_bytes();
  {  // a segment of this name already? Stale (its rank 0 is gone) is replaced; live is another job.
    shm_detail::shm_fd old(shm_open(name_.c_str(), O_RDWR, 0600));
    struct stat st {};
    if (old.f < 0 && errno == EACCES) check_name_owner();
    if (old.f >= 0 && fstat(old.f, &st) == 0) check_owner(st);
    if (old.f >= 0 && std::size_t(st.st_size) >= prefix_bytes()) {
      shm_detail::mapping m;
      if (m.map(old.f, prefix_bytes()) &&
          reinterpret_cast<header*>(m.get())->magic.load(std::memory_order_acquire) == kMagic && creator_alive(m.get()))
        throw error(errc::invalid_argument, who() + ": another job with this name is attaching (its rank 0 is process " +
                                                std::to_string(reinterpret_cast<rank_ctl*>(m.get() + layout::ranks_off())->pid) +
                                                "): give each job its own COLLX_JOB");
    }
    if (old.f >= 0 && shm_unlink(name_.c_str()) != 0 && errno != ENOENT) sys_fail("cannot remove the stale segment of this name");
  }
  shm_detail::shm_fd fd(shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  if (fd.f < 0) {
    struct stat st {};
    if (errno == EEXIST) {  // made meanwhile by someone else: whose?
      shm_detail::shm_fd other(shm_open(name_.c_str(), O_RDONLY, 0600));
      if (other.f < 0 && errno == EACCES) check_name_owner();
      if (other.f >= 0 && fstat(other.f, &st) == 0) check_owner(st);
      errno = EEXIST;
    }
    sys_fail("cannot create the segment");
  }
  {
    struct stat st {};
    if (fstat(fd.f, &st) == 0) {
      ino_ = st.st_ino;
      dev_ = st.st_dev;
    }
  }
  auto fail_unlink = [&](const std::string& what) {
    const int e = errno;
    shm_unlink(name_.c_str());
    errno = e;
    sys_fail(what);
  };
  // The header first, so that if the rest does not fit the other ranks can still read why.
  const std::size_t head = layout::ranks_off();
  if (ftruncate(fd.f, off_t(head)) != 0) fail_unlink("cannot size the segment");
  if (int e = shm_detail::reserve(fd.f, head); e != 0) {
    const auto sp = shm_detail::space_of(fd.f);
    shm_unlink(name_.c_str());
    // (the same message, and fix, as when the rest does not fit: which of the two a full
    // /dev/shm trips over is chance, e.g. in nested splits)
    throw error(errc::transport_error, who() + ": /dev/shm is full: not even the segment's header (" + shm_detail::human_bytes(head) +
                                           ") fits; " +
                                           shm_detail::does_not_fit(n_, bytes, L_.area_bytes(), sp, e, L_.slots, L_.slot_bytes));
  }
  shm_detail::mapping hm;
  if (!hm.map(fd.f, head)) fail_unlink("cannot map the segment's header");
  header& h = *reinterpret_cast<header*>(hm.get());
  h.bytes = bytes;
  h.n = std::uint32_t(n_);
  h.slots = L_.slots;
  h.slot_bytes = L_.slot_bytes;
  h.first_failed.store(-1);
  if (ftruncate(fd.f, off_t(bytes)) != 0) fail_unlink("cannot size the segment");
  if (int e = shm_detail::reserve(fd.f, bytes); e != 0) {
    (void)!ftruncate(fd.f, off_t(head));  // give back what was reserved
    const std::string why = shm_detail::does_not_fit(n_, bytes, L_.area_bytes(), shm_detail::space_of(fd.f), e, L_.slots, L_.slot_bytes);
    std::snprintf(h.why, sizeof h.why, "%s", why.c_str());
    h.status.store(kReserveFailed, std::memory_order_release);
    h.attached.store(1);
    h.magic.store(kMagic, std::memory_order_release);
    // Every rank reports it: wait (until the deadline) for the others to read it.
    while (h.attached.load(std::memory_order_acquire) < std::uint32_t(n_) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    shm_unlink(name_.c_str());
    throw error(errc::transport_error, who() + ": " + why);
  }
  hm.reset();
  shm_detail::mapping all;
  if (!all.map(fd.f, bytes)) fail_unlink("cannot map the segment");
  base_ = all.release();
  bytes_ = bytes;
  for (int r = 0; r < n_; ++r) shm_detail::init_robust(&rc(r).alive);
  hdr().status.store(kReady, std::memory_order_release);
}

inline void shm::join(std::chrono::steady_clock::time_point deadline, const members_of* from) {
  using namespace shm_layout;
  const std::size_t bytes = L_.total_bytes();
  bool saw_stale = false;
  for (int k = 0;; std::this_thread::sleep_for(std::chrono::milliseconds(1)), ++k) {
    if (k % 8 == 0 && from != nullptr && from->gone() == 0) fail_gone(*from, 0, "before it created the segment");
    if (std::chrono::steady_clock::now() > deadline)
      throw error(errc::timeout, who() + " timed out waiting for rank 0 to create the job's segment" +
                                     (saw_stale ? " (found one a crashed run left, which rank 0 replaces when it starts)" : ""));
    shm_detail::shm_fd fd(shm_open(name_.c_str(), O_RDWR, 0600));
    if (fd.f < 0 && errno == EACCES) check_name_owner();
    if (fd.f < 0) continue;
    struct stat st {};
    if (fstat(fd.f, &st) != 0) continue;
    check_owner(st);  // (before a byte of it is read)
    if (std::size_t(st.st_size) < layout::ranks_off()) continue;
    shm_detail::mapping m;
    if (!m.map(fd.f, layout::ranks_off())) continue;
    header& h = *reinterpret_cast<header*>(m.get());
    if (h.magic.load(std::memory_order_acquire) != kMagic) continue;  // rank 0 is still setting it up
    if (h.status.load(std::memory_order_acquire) == kReserveFailed) {
      const std::string why(h.why, strnlen(h.why, sizeof h.why));
      h.attached.fetch_add(1);
      throw error(errc::transport_error, who() + ": rank 0 " + why);
    }
    if (std::size_t(st.st_size) < prefix_bytes() || !m.map(fd.f, prefix_bytes())) continue;
    const header& hh = *reinterpret_cast<const header*>(m.get());
    const bool same = hh.n == std::uint32_t(n_) && hh.slots == L_.slots && hh.slot_bytes == L_.slot_bytes && hh.bytes == bytes &&
                      std::size_t(st.st_size) == bytes;
    if (!creator_alive(m.get())) {  // a crashed run's: rank 0 replaces it
      saw_stale = true;
      continue;
    }
    if (!same)
      throw error(errc::mismatch, who() + " was started for " + std::to_string(n_) + " ranks with " + std::to_string(L_.slots) +
                                      " slots of " + std::to_string(L_.slot_bytes) + " B, but the job's segment is for " +
                                      std::to_string(hh.n) + " ranks with " + std::to_string(hh.slots) + " slots of " +
                                      std::to_string(hh.slot_bytes) + " B (every rank must be started alike)");
    shm_detail::mapping all;
    if (!all.map(fd.f, bytes)) sys_fail("cannot map the segment");
    base_ = all.release();
    bytes_ = bytes;
    ino_ = st.st_ino;
    dev_ = st.st_dev;
    return;
  }
}

inline void shm::probe_single_copy(std::chrono::steady_clock::time_point deadline) {
  bool ok = !cfg_.single_copy_never();
  for (int q = 0; q < n_ && ok; ++q) {
    if (q == rank_) continue;
    std::uint64_t magic = 0;
    iovec local{&magic, sizeof magic}, remote{reinterpret_cast<void*>(rc(q).base), sizeof magic};
    ok = process_vm_readv(rc(q).pid, &local, 1, &remote, 1, 0) == ssize_t(sizeof magic) && magic == shm_layout::kMagic;
  }
  if (!ok) hdr().cma_failed.store(1, std::memory_order_seq_cst);
  hdr().probed.fetch_add(1, std::memory_order_seq_cst);
  // A member that gave up on the attach (it saw another die before the last one came) or died
  // never probes: the first call finds it, not the deadline.
  for (int k = 1; hdr().probed.load(std::memory_order_seq_cst) < std::uint32_t(n_) && std::chrono::steady_clock::now() < deadline; ++k) {
    if (k % 64 == 0) {
      bool lost = false;
      for (int q = 0; q < n_ && !lost; ++q) lost = q != rank_ && peer_gone(q);
      if (lost) break;
    }
    std::this_thread::yield();
  }
  cma_ = hdr().probed.load() == std::uint32_t(n_) && hdr().cma_failed.load() == 0;
}

inline void shm::release() noexcept {
  if (base_ == nullptr) return;
  leave();
  if (keeper_) keeper_->release();
  munmap(base_, bytes_);
  base_ = nullptr;
}

}  // namespace collx::transport
