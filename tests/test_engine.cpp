// A transport is one room (transport/engine.hpp): this file defines one of its own, ranks as
// threads passing frames through non-blocking pipes, in the lines between the two "---" marks
// below, and runs every collective x policy over it, N in {1, 2, 3, 4, 5, 8} x the usual counts,
// every dtype and op, uneven all_to_all_v, mismatched calls and a failing rank, all against the
// serial reference. Nothing else in collx knows it exists.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <collx/transport/engine.hpp>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "harness.hpp"
#include "matrix.hpp"

using namespace collx_test;
using Catch::Matchers::Contains;
namespace algo = collx::algo;
namespace engine = collx::engine;

namespace {

// --- the transport: ranks as threads, a pipe per ordered pair, frames of {signature, bytes} ---
struct frame {
  collx::call_signature sig;
  std::uint64_t bytes = 0;
};
struct pipe_job {  // what the ranks share: the pipes, and who failed or left
  int n;
  std::vector<int> rd, wr;  // [from * n + to]
  std::vector<std::atomic<int>> state;  // engine::fate
  std::mutex mu;
  std::vector<std::string> why;
  std::atomic<int> first_failed{-1};
  std::vector<collx::detail::position> board;  // where each rank is: a deadline's report says
  explicit pipe_job(int n_)
      : n(n_), rd(std::size_t(n * n), -1), wr(rd), state(std::size_t(n)), why(std::size_t(n)), board(std::size_t(n)) {
    for (int i = 0; i < n * n; ++i) {
      int fd[2];
      if (::pipe2(fd, O_NONBLOCK | O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
      rd[std::size_t(i)] = fd[0];
      wr[std::size_t(i)] = fd[1];
    }
  }
  ~pipe_job() {
    for (int i = 0; i < n * n; ++i) ::close(rd[std::size_t(i)]), ::close(wr[std::size_t(i)]);
  }
  void leave(int r, bool failed, const std::string& w) {
    std::lock_guard lk(mu);
    if (state[std::size_t(r)] != int(engine::fate::live)) return;
    why[std::size_t(r)] = w;
    if (int none = -1; failed) first_failed.compare_exchange_strong(none, r);
    state[std::size_t(r)] = int(failed ? engine::fate::failed : engine::fate::left);
  }
};

class pipes {
 public:
  using transport_concept = collx::transport_tag;
  using memory_space = collx::host_memory;
  static constexpr const char* name = "pipes";
  pipes(std::shared_ptr<pipe_job> j, int r) : j_(std::move(j)), r_(r) {}
  int rank() const { return r_; }
  int size() const { return j_->n; }
  collx::detail::position_board positions() const { return {j_->board.data(), sizeof(collx::detail::position), j_->n}; }
  void abort(const std::string& why) { j_->leave(r_, true, why); }
  void exchange(std::span<const collx::send_desc> s, std::span<const collx::recv_desc> r, const collx::exchange_context& ctx) {
    engine::exchange(*this, st_, s, r, ctx);
  }

  // the channel
  struct send_state { frame h; std::size_t off = 0; };
  struct recv_state { frame h; std::size_t off = 0; std::vector<std::byte> data; };
  using step = engine::step<send_state, recv_state>;
  struct token {};
  engine::moved try_send(step& s, std::size_t i) {
    const collx::send_desc& d = s.sends[i];
    send_state& o = s.so[i].s;
    if (o.off == 0) o.h = {s.call->sig, d.bytes};
    const std::size_t before = o.off;
    const int fd = j_->wr[std::size_t(r_ * j_->n + d.peer)];
    while (o.off < sizeof o.h + d.bytes) {
      std::size_t len = sizeof o.h - o.off;
      const std::byte* p = reinterpret_cast<const std::byte*>(&o.h) + o.off;
      if (o.off >= sizeof o.h) {
        len = sizeof o.h + d.bytes - o.off;
        p = collx::detail::operand_at(d.data, d.spread, o.off - sizeof o.h, len);
      }
      const ssize_t w = ::write(fd, p, len);
      if (w < 0 && errno != EAGAIN) s.call->fail(collx::errc::transport_error, std::string("write: ") + std::strerror(errno));
      if (w <= 0) break;
      o.off += std::size_t(w);
    }
    return o.off == sizeof o.h + d.bytes ? engine::moved::done : engine::some_if(o.off > before);
  }
  engine::moved try_recv(step& s, std::size_t i) {
    const collx::recv_desc& d = s.recvs[i];
    recv_state& o = s.ro[i].s;
    const int fd = j_->rd[std::size_t(d.peer * j_->n + r_)];
    const std::size_t before = o.off;
    while (o.off < sizeof o.h + o.data.size()) {
      const bool head = o.off < sizeof o.h;
      std::byte* p = head ? reinterpret_cast<std::byte*>(&o.h) + o.off : o.data.data() + (o.off - sizeof o.h);
      const ssize_t got = ::read(fd, p, head ? sizeof o.h - o.off : sizeof o.h + o.data.size() - o.off);
      if (got == 0 || (got < 0 && errno != EAGAIN))
        s.call->fail(collx::errc::transport_error, "read: " + std::string(got == 0 ? "end of file" : std::strerror(errno)));
      if (got < 0) break;
      o.off += std::size_t(got);
      if (o.off == sizeof o.h) {  // the header: is it this call's, of the size expected?
        s.call->check_match(d.peer, o.h.sig, o.h.bytes, d.bytes);
        o.data.resize(d.bytes);
      }
    }
    if (o.off < sizeof o.h || o.off < sizeof o.h + o.data.size()) return engine::some_if(o.off > before);
    collx::detail::deliver(d, 0, o.data.data(), d.bytes, s.ctx->comb);
    return engine::moved::done;
  }
  token arm() const { return {}; }
  void sleep(const step& s, token, std::chrono::nanoseconds d) {
    std::vector<pollfd> fds;
    s.each_open([&](int p, bool send, std::size_t) {
      fds.push_back({send ? j_->wr[std::size_t(r_ * j_->n + p)] : j_->rd[std::size_t(p * j_->n + r_)], short(send ? POLLOUT : POLLIN), 0});
    });
    ::poll(fds.data(), fds.size(), int(std::clamp<long long>(d.count() / 1000000, 1, 10)));  // short: fates are not polled
  }
  engine::waiting spinning() const { return {0, std::chrono::microseconds(20), 0}; }
  engine::fate fate_of(int p) const { return engine::fate(j_->state[std::size_t(p)].load()); }
  std::string why(int p) const { return fate_of(p) == engine::fate::left ? "it has left" : "it failed: " + failure(p); }
  int failed_rank() const { return j_->first_failed.load(); }
  std::string failure(int f) const {
    std::lock_guard lk(j_->mu);
    return j_->why[std::size_t(f)];
  }

 private:
  std::shared_ptr<pipe_job> j_;
  int r_;
  step st_;
};

struct pipe_threads {  // the launcher: a thread per rank, a communicator each
  template <class F>
  void operator()(int n, F&& f, collx::options o = {}) const {
    auto j = std::make_shared<pipe_job>(n);
    std::vector<std::exception_ptr> failed{std::size_t(n)};
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        try {
          collx::communicator<pipes> comm(pipes{j, r}, o);
          f(comm);
          j->leave(r, false, {});
        } catch (const std::exception& e) {
          j->leave(r, true, e.what());
          failed[std::size_t(r)] = std::current_exception();
        }
      });
    for (auto& t : ts) t.join();
    const int first = j->first_failed.load();
    if (first >= 0) std::rethrow_exception(failed[std::size_t(first)]);
  }
};
// --- end of the transport ---

}  // namespace

TEMPLATE_TEST_CASE("a transport defined by a test, on the engine: reducing collectives equal the serial reference",
                   "[engine]", algo::ring, algo::tree, algo::recursive_halving, algo::automatic) {
  check_reducing_matrix<pipe_threads, TestType>();
}

TEMPLATE_TEST_CASE("a transport defined by a test, on the engine: data-moving collectives deliver every block", "[engine]",
                   algo::ring, algo::tree, algo::recursive_halving, algo::pairwise, algo::automatic) {
  check_moving_matrix<pipe_threads, TestType>();
}

TEST_CASE("a transport defined by a test, on the engine: every dtype and op, uneven all_to_all_v", "[engine]") {
  for (int n : {3, 5}) check_dtypes_and_ops<pipe_threads>(n);
  for (int n : {1, 2, 3, 7}) {
    CAPTURE(n);
    CHECK(run_all_to_all_v<pipe_threads>(n) == "");
  }
}

TEST_CASE("a transport defined by a test, on the engine: mismatches, a failing rank and a deadline are reported", "[engine]") {
  // Different counts: errc::mismatch from the engine's channel, both sizes named.
  const std::string mismatch = run_checked<pipe_threads>(3, [](auto& comm, auto) {
    std::vector<float> v(comm.rank() == 1 ? 7 : 8, 1.0f);
    collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
  });
  CHECK_THAT(mismatch, Contains("counts differ") || Contains("made different calls"));
  // A rank that throws before its call: the others are told by the engine, naming it and why it
  // failed (its communicator, leaving scope with an exception, says so).
  std::string lost;
  bool peer_lost = false;
  std::mutex mu;
  (void)run_checked<pipe_threads>(4, [&](auto& comm, auto) {
    if (comm.rank() == 2) throw std::runtime_error("rank 2 gives up");
    std::vector<float> v(1000, 1.0f);
    try {
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    } catch (const collx::error& e) {
      std::lock_guard lk(mu);
      if (comm.rank() == 3) lost = e.what(), peer_lost = e.code() == collx::errc::peer_lost;
      throw;
    }
  });
  CHECK(peer_lost);
  CHECK_THAT(lost, Contains("lost rank 2: it failed") && Contains("its own code threw"));
  // A rank that never calls: the others reach their deadline, naming whom they wait for.
  collx::options o;
  o.timeout = std::chrono::milliseconds(300);
  std::string late;
  try {
    pipe_threads{}(2, [](auto& comm) {
      if (comm.rank() == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(900));
        return;
      }
      std::vector<float> v(10, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    }, o);
  } catch (const collx::error& e) {
    late = e.what();
    CHECK(e.code() == collx::errc::timeout);
  }
  CHECK_THAT(late, Contains("rank 1"));
}

namespace {
/// A channel without `ready` (the engine waits by sweeping) whose one receive completes on the
/// n-th try, from a peer that has already left: the try that moves it is the one the check of
/// the peers makes between sleeps.
struct scripted {
  struct send_state {};
  struct recv_state {};
  using step = engine::step<send_state, recv_state>;
  struct token {};
  int tries = 0, done_at = 0;
  engine::moved try_send(step&, std::size_t) { return engine::moved::nothing; }
  engine::moved try_recv(step&, std::size_t) { return ++tries >= done_at ? engine::moved::done : engine::moved::nothing; }
  token arm() const { return {}; }
  void sleep(const step&, token, std::chrono::nanoseconds d) { std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(d, std::chrono::milliseconds(1))); }
  engine::waiting spinning() const { return {0, std::chrono::nanoseconds(0), 0}; }
  engine::fate fate_of(int) const { return engine::fate::left; }
  std::string why(int) const { return "it has left"; }
  int failed_rank() const { return -1; }
  std::string failure(int) const { return {}; }
};
}  // namespace

TEST_CASE("the engine: a step whose last operation a check of the peers moves is done at once, not at its deadline", "[engine]") {
  // Tries: the exchange's first sweep (1), the look before blocking (2), the look after arming
  // (3), then the check of the peers, which finds the peer gone and looks once more (4): that
  // one completes the receive. (Before the fix the wait went on, for nothing, to its deadline.)
  scripted ch;
  ch.done_at = 4;
  scripted::step st;
  collx::call_info call;
  call.timeout = std::chrono::milliseconds(500);
  const collx::exchange_context ctx{&call, {}, false};
  std::byte buf[4]{};
  const collx::recv_desc r{1, buf, sizeof buf, nullptr, collx::combine::copy};
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_NOTHROW(engine::exchange(ch, st, std::span<const collx::send_desc>{}, std::span<const collx::recv_desc>(&r, 1), ctx));
  CHECK(ch.tries == 4);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(400));
}
