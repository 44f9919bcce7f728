#pragma once
// Whether a rank's process still lives, as its peers can tell from shared memory alone.
//
// Each rank's liveness is a robust, process-shared mutex in the segment, held for as long as the
// rank is attached. When the process dies (SIGKILL included) the kernel releases it, and the
// next peer that tries it gets EOWNERDEAD, so a dead peer is found within one sleep slice of a
// waiter, not at the timeout. A robust mutex belongs to a thread, though, and is released (as
// if the owner died) when that thread ends: were it held by whichever thread attached, a
// transport set up by a thread that then finishes (a setup thread, a progress thread) would be
// reported dead while its process lives, and leave() from another thread could not release it.
// So the mutex is held by a thread of its own, which lives exactly as long as the attachment:
// liveness belongs to the process. It sleeps on a condition variable and costs no CPU.
#include <pthread.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "../../core/error.hpp"

namespace collx::transport::shm_detail {

class liveness_keeper {
 public:
  liveness_keeper() = default;
  liveness_keeper(const liveness_keeper&) = delete;
  liveness_keeper& operator=(const liveness_keeper&) = delete;
  ~liveness_keeper() { release(); }

  /// Starts holding `m` (robust, process-shared) from a thread of its own; returns once it is
  /// held. Throws when another live thread holds it (errc::invalid_argument: the rank is
  /// attached already, by another process) or the thread cannot start.
  void hold(pthread_mutex_t* m) {
    release();
    m_ = m;
    stop_ = false;
    held_ = false;
    int err = 0;
    try {
      thread_ = std::thread([this] {
        int r = pthread_mutex_trylock(m_);
        if (r == EOWNERDEAD) r = pthread_mutex_consistent(m_);  // a previous holder died: it is ours now
        std::unique_lock lk(mu_);
        held_ = true;
        err_ = r;
        cv_.notify_all();
        cv_.wait(lk, [this] { return stop_; });
        if (err_ == 0) pthread_mutex_unlock(m_);
      });
    } catch (const std::exception& e) {
      throw error(errc::transport_error, std::string("shm: cannot start the liveness thread: ") + e.what());
    }
    std::unique_lock lk(mu_);
    cv_.wait(lk, [this] { return held_; });
    err = err_;
    lk.unlock();
    if (err != 0) {
      release();
      if (err == EBUSY) throw error(errc::invalid_argument, "shm: another process is attached as this rank");
      throw error(errc::transport_error, std::string("shm: cannot hold this rank's liveness mutex: ") + std::strerror(err));
    }
  }

  /// Lets go of the mutex (peers then see a rank that is not attached) and ends the thread.
  void release() noexcept {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  bool holding() const noexcept { return thread_.joinable(); }

 private:
  pthread_mutex_t* m_ = nullptr;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, held_ = false;
  int err_ = 0;
};

/// Initialises a robust, process-shared mutex in shared memory.
inline void init_robust(pthread_mutex_t* m) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(m, &a);
  pthread_mutexattr_destroy(&a);
}

enum class holder { alive, died, none };

/// Who holds `m`: a live thread (alive), nobody because its holder died (died: the mutex is
/// made consistent and released again), or nobody (none).
inline holder probe(pthread_mutex_t* m) noexcept {
  const int r = pthread_mutex_trylock(m);
  if (r == EBUSY) return holder::alive;
  if (r == EOWNERDEAD) {
    pthread_mutex_consistent(m);
    pthread_mutex_unlock(m);
    return holder::died;
  }
  if (r == 0) pthread_mutex_unlock(m);
  return holder::none;
}

}  // namespace collx::transport::shm_detail
