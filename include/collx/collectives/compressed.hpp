#pragma once
// algo::compressed's all_reduce (algo/compressed.hpp): float data on the wire in a compressed
// format, summed in float at every receiver. Built from two collectives' exchanges, run under
// the all_reduce's own call: pairwise's all-to-all of the encoded blocks, then Gather's
// all-gather of the encoded sums. (One rank alone rounds through the format as well: a result
// does not change its kind with the rank count.)
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "all_gather.hpp"
#include "all_to_all.hpp"
#include "../algo/compressed.hpp"
#include "../algo/pairwise.hpp"

namespace collx::detail {

/// A thread beside a call for work that touches no communicator (a codec's loops): post() hands
/// it one job, wait() returns once that job is done (rethrowing what it threw). Destroyed on
/// every path, it finishes its job and is joined.
class side_thread {
 public:
  side_thread() : thread_([this] { loop(); }) {}
  side_thread(const side_thread&) = delete;
  side_thread& operator=(const side_thread&) = delete;
  ~side_thread() {
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return !busy_; });
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  template <class F>
  void post(F&& job) {
    {
      std::lock_guard lock(mutex_);
      job_ = std::forward<F>(job);
      busy_ = true;
    }
    changed_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !busy_; });
    if (failed_) std::rethrow_exception(std::exchange(failed_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return busy_ || stop_; });
      if (!busy_) return;
      auto job = std::move(job_);
      lock.unlock();
      try {
        job();
      } catch (...) {
        lock.lock();
        failed_ = std::current_exception();
        lock.unlock();
      }
      lock.lock();
      busy_ = false;
      changed_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> job_;
  std::exception_ptr failed_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;  // (last: started once the rest is built)
};

template <class T, class Op, class W, class G>
void compressed_all_reduce(communicator<T>& comm, const call_info& call, const float* in, float* out, std::size_t count,
                           const algo::compressed<W, G>& a) {
  static_assert(std::is_same_v<Op, ops::sum> || std::is_same_v<Op, ops::avg>,
                "collx: algo::compressed sums (ops::sum, ops::avg): its receivers add what arrives in float");
  using U = typename W::unit;
  const std::size_t n = std::size_t(comm.size());
  const std::size_t r = std::size_t(comm.rank());
  // Each segment cut into n blocks of B elements, B a multiple of the format's group (a scale's
  // 32 values stay in one block); the last blocks may be shorter, or empty.
  auto round_up = [](std::size_t x, std::size_t m) { return (x + m - 1) / m * m; };
  const std::size_t seg = std::max(a.segment, n * W::group);
  const std::size_t most = std::min(seg, count), segments = (count + seg - 1) / seg;
  const std::size_t bmax = round_up((most + n - 1) / n, W::group), wmax = W::units(bmax);
  // Segment s goes through five stages: E, its blocks encoded; X1, the direct exchange (rank q
  // receives block q from every rank); A, the contributions added in float in rank order and the
  // sum encoded; X2, the all-gather of the encoded sums; D, every block decoded into out. This
  // thread runs the exchanges, a side thread the codec beside them (calls of several segments):
  //
  //   round s:  X1(s)  beside A(s-1),  then  X2(s-1)  beside E(s+1) and D(s-2)
  //
  // so that on a link where bytes are the cost the codec hides behind it. Scratch (the
  // communicator's wire buffer, reused across calls): one encoded input, two segments'
  // contributions received and two all-gathered sums (a round's exchange and the stage beside it
  // use different halves), and the float sum.
  const std::size_t units = n * wmax, lines = (units * sizeof(U) + 63) / 64 * 64;
  std::byte* mem = comm.wire_buffer(5 * lines + bmax * sizeof(float));
  U* const sent = reinterpret_cast<U*>(mem);
  auto got = [&](std::size_t s) { return reinterpret_cast<U*>(mem + (1 + s % 2) * lines); };
  auto all = [&](std::size_t s) { return reinterpret_cast<U*>(mem + (3 + s % 2) * lines); };
  float* const acc = reinterpret_cast<float*>(mem + 5 * lines);
  struct cut {
    std::size_t off, len, b, wb;
    std::size_t lo(std::size_t q) const { return std::min(q * b, len); }
    std::size_t hi(std::size_t q) const { return std::min(q * b + b, len); }
  };
  auto cut_of = [&](std::size_t s) {
    const std::size_t off = s * seg, len = std::min(seg, count - off), b = round_up((len + n - 1) / n, W::group);
    return cut{off, len, b, W::units(b)};
  };
  auto encode = [&](std::size_t s) {  // E
    const cut c = cut_of(s);
    for (std::size_t q = 0; q < n; ++q) {  // (a short block's tail zeroed: it travels, and is not read)
      W::encode(in + c.off + c.lo(q), c.hi(q) - c.lo(q), sent + q * c.wb);
      std::fill(sent + q * c.wb + W::units(c.hi(q) - c.lo(q)), sent + (q + 1) * c.wb, U(0));
    }
  };
  auto add = [&](std::size_t s) {  // A: the sum encoded once, in place in the all-gather's buffer
    const cut c = cut_of(s);
    const std::size_t m = c.hi(r) - c.lo(r);
    std::fill(acc, acc + m, 0.0f);
    for (std::size_t q = 0; q < n; ++q) W::add(got(s) + q * c.wb, m, acc);
    if constexpr (has_finalize_v<Op, float>)
      for (std::size_t i = 0; i < m; ++i) acc[i] = Op::finalize(acc[i], int(n));
    U* const mine = all(s) + r * c.wb;
    W::encode(acc, m, mine);
    std::fill(mine + W::units(m), mine + c.wb, U(0));
  };
  auto decode = [&](std::size_t s) {  // D
    const cut c = cut_of(s);
    for (std::size_t q = 0; q < n; ++q) W::decode(all(s) + q * c.wb, c.hi(q) - c.lo(q), out + c.off + c.lo(q));
  };
  std::optional<side_thread> side;
  if (segments > 1) side.emplace();
  auto beside = [&](auto job) {  // a stage beside this thread's exchange (here, alone)
    if (side)
      side->post(std::move(job));
    else
      job();
  };
  auto joined = [&] {
    if (side) side->wait();
  };
  if (segments > 0) encode(0);
  for (std::size_t s = 0; s <= segments; ++s) {
    if (s > 0) beside([&, s] { add(s - 1); });
    if (s < segments) all_to_all_uniform(comm, call, static_cast<const U*>(sent), got(s), cut_of(s).wb, algo::pairwise{});
    joined();
    beside([&, s] {
      if (s + 1 < segments) encode(s + 1);
      if (s >= 2) decode(s - 2);
    });
    if (s > 0) {
      const cut c = cut_of(s - 1);
      all_gather_blocks(comm, call, static_cast<const U*>(all(s - 1) + r * c.wb), all(s - 1), partition(n * c.wb, int(n)), true,
                        a.gather);
    }
    joined();
  }
  if (segments > 0) decode(segments - 1);
}

}  // namespace collx::detail
