// Nonblocking calls (features/async.hpp), fused batches (features/fuse.hpp) and gradient buckets (features/buckets.hpp):
// results against the serial reference, order, progress while the caller computes, and errors
// that reach wait() as blocking calls report them.
#include <catch2/catch.hpp>

#include <collx/collx.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <atomic>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "harness.hpp"

using namespace collx_test;
using namespace std::chrono_literals;

namespace {

/// One outstanding call of some kind and what it must leave, checked after every wait.
struct pending_check {
  collx::work w;
  std::function<std::string()> check;
};

/// Issues `calls` nonblocking calls of mixed kinds and counts (0, 1, n-1, n+1, a prime) on comm,
/// all outstanding at once, then waits for them in order and checks each against the reference.
template <class Comm, class Note>
void many_outstanding(Comm& comm, int calls, Note note) {
  const int n = comm.size(), r = comm.rank();
  const std::size_t counts[] = {0, 1, std::size_t(n > 1 ? n - 1 : 2), std::size_t(n + 1), 1009};
  std::vector<std::shared_ptr<void>> keep;  // the buffers, alive until the checks ran
  std::vector<pending_check> out;
  for (int i = 0; i < calls; ++i) {
    const std::size_t count = counts[std::size_t(i) % 5];
    const int root = i % n;
    switch (i % 8) {
      case 0: {  // all_reduce sum, in place
        auto b = std::make_shared<std::vector<int>>(inputs<int, collx::ops::sum>(r, count));
        keep.push_back(b);
        out.push_back({collx::async::all_reduce(comm, std::span{*b}, collx::ops::sum{}),
                       [b, n, count] { return compare(*b, reference<int>(collx::ops::sum{}, n, count)); }});
        break;
      }
      case 1: {  // all_reduce max, out of place
        auto in = std::make_shared<std::vector<long>>(inputs<long, collx::ops::max>(r, count));
        auto o = std::make_shared<std::vector<long>>(count);
        keep.push_back(in);
        keep.push_back(o);
        out.push_back({collx::async::all_reduce(comm, std::span<const long>{*in}, std::span{*o}, collx::ops::max{}),
                       [o, n, count] { return compare(*o, reference<long>(collx::ops::max{}, n, count)); }});
        break;
      }
      case 2: {  // broadcast
        auto b = std::make_shared<std::vector<int>>(count);
        for (std::size_t j = 0; j < count; ++j) (*b)[j] = payload<int>(r, j);
        keep.push_back(b);
        out.push_back({collx::async::broadcast(comm, std::span{*b}, root), [b, root, count] {
                         std::vector<int> want(count);
                         for (std::size_t j = 0; j < count; ++j) want[j] = payload<int>(root, j);
                         return compare(*b, want);
                       }});
        break;
      }
      case 3: {  // all_gather
        auto in = std::make_shared<std::vector<int>>(count);
        auto o = std::make_shared<std::vector<int>>(count * std::size_t(n));
        for (std::size_t j = 0; j < count; ++j) (*in)[j] = payload<int>(r, j);
        keep.push_back(in);
        out.push_back({collx::async::all_gather(comm, std::span<const int>{*in}, std::span{*o}), [in, o, n, count] {
                         std::vector<int> want(count * std::size_t(n));
                         for (int q = 0; q < n; ++q)
                           for (std::size_t j = 0; j < count; ++j) want[std::size_t(q) * count + j] = payload<int>(q, j);
                         return compare(*o, want);
                       }});
        break;
      }
      case 4: {  // reduce_scatter
        auto in = std::make_shared<std::vector<int>>(inputs<int, collx::ops::sum>(r, count * std::size_t(n)));
        auto o = std::make_shared<std::vector<int>>(count);
        keep.push_back(in);
        out.push_back({collx::async::reduce_scatter(comm, std::span<const int>{*in}, std::span{*o}, collx::ops::sum{}),
                       [o, n, r, count] {
                         const auto want = reference<int>(collx::ops::sum{}, n, count * std::size_t(n));
                         return compare(*o, std::vector<int>(want.begin() + std::ptrdiff_t(count) * r,
                                                             want.begin() + std::ptrdiff_t(count) * (r + 1)));
                       }});
        break;
      }
      case 5: {  // all_to_all
        auto in = std::make_shared<std::vector<int>>(count * std::size_t(n));
        auto o = std::make_shared<std::vector<int>>(count * std::size_t(n));
        for (std::size_t j = 0; j < in->size(); ++j) (*in)[j] = payload<int>(r, j);
        keep.push_back(in);
        out.push_back({collx::async::all_to_all(comm, std::span<const int>{*in}, std::span{*o}), [o, n, r, count] {
                         std::vector<int> want(count * std::size_t(n));
                         for (int q = 0; q < n; ++q)
                           for (std::size_t j = 0; j < count; ++j)
                             want[std::size_t(q) * count + j] = payload<int>(q, std::size_t(r) * count + j);
                         return compare(*o, want);
                       }});
        break;
      }
      case 6: {  // reduce to a root
        auto in = std::make_shared<std::vector<int>>(inputs<int, collx::ops::sum>(r, count));
        auto o = std::make_shared<std::vector<int>>(r == root ? count : 0);
        keep.push_back(in);
        out.push_back({collx::async::reduce(comm, std::span<const int>{*in}, std::span{*o}, collx::ops::sum{}, root),
                       [o, n, r, root, count] {
                         return r == root ? compare(*o, reference<int>(collx::ops::sum{}, n, count)) : std::string();
                       }});
        break;
      }
      default:
        out.push_back({collx::async::barrier(comm), [] { return std::string(); }});
    }
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].w.wait();
    if (!out[i].w.test()) note("test() false after wait()");
    if (auto p = out[i].check(); !p.empty()) note("call " + std::to_string(i) + ": " + p);
  }
}

}  // namespace

TEST_CASE("64 and more outstanding nonblocking calls of mixed kinds and counts, every result checked", "[async]") {
  for (int n : {1, 2, 3, 5}) {
    CAPTURE(n);
    auto body = [](auto& comm, auto note) { many_outstanding(comm, 80, note); };
    CHECK(run_checked<threads>(n, body) == "");
    CHECK(run_checked<processes>(n, body) == "");
    CHECK(run_checked<processes_tcp>(n, body) == "");
  }
  // And on split communicators, from two threads of each rank at once.
  CHECK(run_checked<processes>(4, [](auto& comm, auto note) {
          auto a = comm.split(comm.rank() % 2, comm.rank());
          auto b = comm.split(comm.rank() / 2, comm.rank());
          std::string pa, pb;
          std::thread t([&] { many_outstanding(b, 64, [&](const std::string& s) { if (pb.empty()) pb = s; }); });
          many_outstanding(a, 64, [&](const std::string& s) { if (pa.empty()) pa = s; });
          t.join();
          note(pa);
          note(pb);
        }) == "");
}

TEST_CASE("blocking and nonblocking calls complete in the order issued", "[async]") {
  CHECK(run_checked<threads>(3, [](auto& comm, auto note) {
          // Each call doubles what the one before it left, then adds the rank: the result tells
          // the order they ran in.
          std::vector<long> v(5, 1);
          std::vector<collx::work> ws;
          // A fused batch's run() is a blocking call (it runs the queued calls first), also when
          // run inside a nonblocking call.
          auto fused_sum = [&v](auto& c) {
            collx::fused f(c);
            f.all_reduce(std::span{v}, collx::ops::sum{});
            f.run();
          };
          for (int i = 0; i < 10; ++i) {
            if (i % 3 == 2) collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
            else if (i == 4) fused_sum(comm);
            else if (i == 7) ws.push_back(collx::async::run(comm, fused_sum));
            else ws.push_back(collx::async::all_reduce(comm, std::span{v}, collx::ops::sum{}));
          }
          for (auto& w : ws) w.wait();
          long want = 1;
          for (int i = 0; i < 10; ++i) want *= 3;
          if (v[0] != want) note("got " + std::to_string(v[0]) + ", want " + std::to_string(want));
        }) == "");
}

TEST_CASE("an outstanding call advances while the caller computes, not only inside wait()", "[async]") {
  auto body = [](auto& comm, auto note) {
    std::vector<int> v(100000, comm.rank());
    auto w = collx::async::all_reduce(comm, std::span{v}, collx::ops::sum{});
    // "Compute" without calling wait(): the call must complete meanwhile.
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (!w.test() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    if (!w.test()) note("the call did not complete while the caller was not waiting");
    w.wait();
    if (v[0] != comm.size() * (comm.size() - 1) / 2) note("wrong sum");
  };
  CHECK(run_checked<threads>(3, body) == "");
  CHECK(run_checked<processes>(3, body) == "");
  CHECK(run_checked<processes_tcp>(3, body) == "");
}

TEST_CASE("destroying a work that was not waited for waits for its call", "[async]") {
  CHECK(run_checked<processes>(3, [](auto& comm, auto note) {
          std::vector<int> v(50000, 1);
          {
            auto w = collx::async::all_reduce(comm, std::span{v}, collx::ops::sum{});
          }  // waits here
          if (v.front() != 3 || v.back() != 3) note("the call had not completed when its work was destroyed");
          // A work assigned over waits for the one it held.
          std::vector<int> a(10, 1), b(10, 2);
          collx::work w = collx::async::all_reduce(comm, std::span{a}, collx::ops::sum{});
          w = collx::async::all_reduce(comm, std::span{b}, collx::ops::sum{});
          if (a[0] != 3) note("assigning over a work did not wait for it");
          w.wait();
          if (b[0] != 6) note("wrong second result");
        }) == "");
}

TEST_CASE("continuations: each runs once after its call completes in issue order and sees the call's error", "[async][then]") {
  auto body = [](auto& comm, auto note) {
    const int n = comm.size();
    constexpr int kCalls = 12;
    std::atomic<int> busy{0};
    collx::work last;
    for (int round = 0; round < 15; ++round) {
      std::vector<std::vector<int>> bufs;
      for (int i = 0; i < kCalls; ++i) bufs.emplace_back(std::size_t(1 + 97 * i), comm.rank() + i);
      std::vector<int> order;  // written by continuations only: one at a time, in the calls' order
      std::vector<collx::work> ws;
      for (int i = 0; i < kCalls; ++i) {
        ws.push_back(collx::async::all_reduce(comm, std::span{bufs[std::size_t(i)]}, collx::ops::sum{}));
        ws.back().then([&, i](std::exception_ptr e) {
          // (one thread may settle a call it ran while another runs the next: their continuations
          // must still run one at a time; a first version let them overlap, waits in order over tcp)
          if (busy.fetch_add(1) != 0) note("two continuations ran at once");
          std::this_thread::yield();
          busy.fetch_sub(1);
          if (e) note("a continuation got an error");
          // the call's result is in place when its continuation runs
          const int want = n * (n - 1) / 2 + n * i;
          const auto& b = bufs[std::size_t(i)];
          if (b.front() != want || b.back() != want) note("call " + std::to_string(i) + "'s continuation ran before its result was in place");
          order.push_back(i);
        });
      }
      for (auto& w : ws) w.wait();
      std::vector<int> want(kCalls);
      std::iota(want.begin(), want.end(), 0);
      if (order != want) note("continuations ran out of order, or not once each");
      last = std::move(ws.back());
    }
    // one added to a work that is done runs at once, on this thread
    bool ran = false;
    const auto me = std::this_thread::get_id();
    last.then([&](std::exception_ptr) { ran = std::this_thread::get_id() == me; });
    if (!ran) note("a continuation added to a done work did not run at once on the adding thread");
    collx::work none;
    none.then([&](std::exception_ptr e) { ran = e == nullptr; });
    if (!ran) note("a default work's continuation did not run");
  };
  for (int n : {1, 2, 3, 5}) CHECK(run_checked<threads>(n, body) == "");
  for (int rep = 0; rep < 3; ++rep) {
    CHECK(run_checked<processes>(3, body) == "");
    CHECK(run_checked<processes_tcp>(3, body) == "");
  }
}

TEST_CASE("a continuation sees its call's error", "[async][then]") {
  collx::options o;
  o.timeout = 200ms;
  failures f(2);
  collx::launch_threads(
      2,
      [&](auto& comm) {
        auto note = [&](const std::string& m) { f.note(comm.rank(), m); };
        std::vector<int> v(10 + std::size_t(comm.rank()), 1);  // different counts: a mismatch
        std::string seen;
        auto w = collx::async::all_reduce(comm, std::span{v}, collx::ops::sum{});
        w.then([&](std::exception_ptr e) {
          try {
            if (e) std::rethrow_exception(e);
          } catch (const collx::error& x) {
            seen = x.what();
          }
        });
        try {
          w.wait();
          note("no error");
        } catch (const collx::error&) {
        }
        if (seen.find("all_reduce") == std::string::npos) note("the continuation did not see the call's error: '" + seen + "'");
      },
      o);
  CHECK(f.first() == "");
}

// A continuation that makes a call on its communicator (PowerSGD's callbacks all-reduce): that
// call comes right after the call it continues, on every rank, whatever the timing. Here the
// ranks' timing differs on purpose: rank r's call A completes before or after its continuation
// is added, its main thread issues the next call C at once or after a while. If C could run
// before the continuation's B on one rank and after it on another, B and C (of different counts)
// would meet as a mismatch, or sum the wrong buffers.
TEST_CASE("a call made from a continuation comes right after the call it continues on every rank", "[async][then]") {
  auto body = [](auto& comm, auto note) {
    const int n = comm.size(), r = comm.rank();
    for (int round = 0; round < 20; ++round) {
      std::vector<int> a(64, 1), b(33, r), c(17, 2 * r);
      const bool late = (r + round) % 2 == 1;
      auto wa = collx::async::all_reduce(comm, std::span{a}, collx::ops::sum{});
      if (late) std::this_thread::sleep_for(1ms);  // A may be done before the continuation is added
      wa.then([&](std::exception_ptr e) {
        if (!e) collx::all_reduce(comm, std::span{b}, collx::ops::sum{});  // B, a blocking call
      });
      if (!late) std::this_thread::sleep_for(1ms);
      auto wc = collx::async::all_reduce(comm, std::span{c}, collx::ops::sum{});  // C
      wc.wait();
      wa.wait();
      if (a[0] != n || b[0] != n * (n - 1) / 2 || b[32] != n * (n - 1) / 2 || c[0] != n * (n - 1) || c[16] != n * (n - 1))
        note("round " + std::to_string(round) + ": wrong sums (the continuation's call met another)");
    }
  };
  for (int n : {2, 3, 5}) CHECK(run_checked<threads>(n, body) == "");
  CHECK(run_checked<processes>(3, body) == "");
  CHECK(run_checked<processes_tcp>(3, body) == "");
}

// The call's captures and its continuations are the user's code: they may need a lock that the
// thread making the next call holds (under torch: the GIL, which a tensor's last reference needs
// to free its Python object). They run with no lock of collx's held: a capture's destructor
// runs after the communicator's turn is let go, and a continuation stuck past the deadline
// fails the calls after it with an error that says so, instead of holding them for ever.
// (Before, both ran under the turn: the first case deadlocked and the second hung.)
TEST_CASE("a call's captures and continuations run with no lock of collx's held", "[async][then]") {
  collx::options o;
  o.timeout = 500ms;
  failures f(2);
  SECTION("a capture's destructor takes a lock the thread making the next call holds") {
    std::recursive_mutex held;  // (recursive: the rank's own thread may run the call, and drop it)
    struct takes_lock {
      std::recursive_mutex* m;
      ~takes_lock() {
        if (m != nullptr) std::lock_guard g(*m);
      }
    };
    collx::launch_threads(
        2,
        [&](auto& comm) {
          std::vector<int> v(1000, 1), u(10, 1);
          if (comm.rank() == 1) {
            std::this_thread::sleep_for(100ms);  // rank 0's progress thread waits in the call meanwhile
            collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
            collx::all_reduce(comm, std::span{u}, collx::ops::sum{});
            return;
          }
          std::unique_lock g(held);
          auto cap = std::make_shared<takes_lock>(takes_lock{&held});
          auto w = collx::async::run(comm, [&v, guard = std::move(cap)](auto& c) { collx::all_reduce(c, std::span{v}, collx::ops::sum{}); });
          w.detach();
          std::this_thread::sleep_for(20ms);
          // The progress thread runs the call; its capture (made to take `held` as it goes)
          // is dropped while this thread, holding `held`, makes the next call.
          collx::all_reduce(comm, std::span{u}, collx::ops::sum{});
          g.unlock();
          if (v[0] != 2 || u[0] != 2) f.note(0, "wrong sums");
        },
        o);
  }
  SECTION("a continuation that does not return: the calls after it fail at the deadline and say why") {
    // Rank 1 joins the first call only once rank 0 has attached its continuation (so `then` does
    // not run it at once), and rank 0 makes its next call only once the continuation has started
    // (so that call's turn does not run the queued one, and its continuation, on rank 0's thread):
    // the continuation runs on the progress thread. On rank 0's it would wait for `go`, which only
    // that thread sets (the test hung so under TSan).
    std::atomic<bool> attached{false}, entered{false};
    collx::launch_threads(
        2,
        [&](auto& comm) {
          std::vector<int> v(10, 1);
          if (comm.rank() == 1) {
            const auto until = std::chrono::steady_clock::now() + 60s;
            while (!attached.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
            collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
            try {
              collx::all_reduce(comm, std::span{v}, collx::ops::sum{});  // rank 0 never comes
              f.note(1, "the second call did not fail");
            } catch (const collx::error&) {
            }
            return;
          }
          std::atomic<bool> go{false};
          auto w = collx::async::all_reduce(comm, std::span{v}, collx::ops::sum{});
          w.then([&](std::exception_ptr) {
            entered = true;
            while (!go.load()) std::this_thread::sleep_for(1ms);  // stuck, as a callback waiting for a GIL
          });
          attached = true;
          const auto until = std::chrono::steady_clock::now() + 60s;  // (a deadline: the call ends in microseconds)
          while (!entered.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
          if (!entered.load()) {
            f.note(0, "the first call's continuation did not start within 60 s");
            go = true;
            w.wait();
            return;
          }
          std::string what;
          const auto t0 = std::chrono::steady_clock::now();
          try {
            collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
          } catch (const collx::error& e) {
            what = e.what();
            if (e.code() != collx::errc::timeout) f.note(0, std::string("not a timeout: ") + e.what());
          }
          go = true;
          w.wait();
          if (std::chrono::steady_clock::now() - t0 > 5s) f.note(0, "the call waited past its deadline");
          if (what.find("continuations of an earlier call") == std::string::npos || what.find("rank 0") == std::string::npos)
            f.note(0, "the error does not say the calls wait for a continuation: " + what);
        },
        o);
  }
  CHECK(f.first() == "");
}

// What a review of the first version found, each with the case that broke it.
TEST_CASE("the call queue: order and lifetimes under threads", "[async][then]") {
  SECTION("a blocking call runs after every call its thread queued while other threads queue theirs") {
    // (with producers linking their calls in two steps, a blocking call could run before the
    // one its own thread had just queued behind a producer caught between its two steps)
    collx::launch_threads(1, [](auto& comm) {
      std::atomic<bool> stop{false};
      std::vector<std::thread> spam;
      for (int s = 0; s < 3; ++s)
        spam.emplace_back([&] {
          for (unsigned k = 1; !stop.load(); ++k) {
            auto w = collx::async::run(comm, [](auto&) {});
            if (k % 16 == 0) w.wait();  // bounded: the queue does not outgrow memory
            else w.detach();
          }
        });
      int bad = 0;
      for (int i = 0; i < 3000; ++i) {
        std::atomic<bool> ran{false};
        collx::async::run(comm, [&](auto&) { ran = true; }).detach();
        collx::fused<typename std::decay_t<decltype(comm)>::transport_type> f(comm);  // a blocking call
        f.then([&](auto&) { bad += !ran.load(); });
        f.run();
      }
      stop = true;
      for (auto& t : spam) t.join();
      CHECK(bad == 0);
    });
  }
  SECTION("a call whose body waits for a later call lives until it returns though its work was dropped") {
    // (the later call, taken while the body runs, dropped the queue's reference: the running
    // call was freed under its own feet; ASan saw it)
    collx::launch_threads(1, [](auto& comm) {
      for (int i = 0; i < 50; ++i) {
        auto later = std::make_shared<collx::work>();
        std::atomic<bool> ready{false}, finished{false};
        std::vector<int> v(64, i);
        collx::async::run(comm, [&, later](auto&) {
          while (!ready.load()) std::this_thread::yield();
          later->wait();
          v[0] += 1;  // touches its own captures after the wait
          finished = true;
        }).detach();
        *later = collx::async::run(comm, [](auto&) {});
        ready = true;
        while (!finished.load()) std::this_thread::yield();
        CHECK(v[0] == i + 1);
      }
    });
  }
  SECTION("a communicator destroyed as soon as a call's waiter goes on while its runner still drops the captures") {
    // (the call was done before its captures were dropped and exec_ taken back: the waiter's
    // thread could destroy the communicator under the runner; ASan saw it)
    collx::launch_threads(1, [](auto& comm) {
      static std::atomic<bool> dropped{false};
      struct slow_drop {
        ~slow_drop() {
          std::this_thread::sleep_for(20ms);
          dropped = true;
        }
      };
      for (int i = 0; i < 5; ++i) {
        auto c = comm.split(0, 0);
        collx::async::run(c, [](auto&) {}).wait();
        std::this_thread::sleep_for(10ms);  // its progress thread asleep: the thread that waits runs the next call
        std::shared_ptr<collx::work> w;
        std::atomic<bool> published{false};
        std::thread runner([&] {
          w = std::make_shared<collx::work>(collx::async::run(c, [d = std::make_shared<slow_drop>()](auto&) {}));
          published = true;
          w->wait();  // runs the call here, then drops its captures
        });
        while (!published.load()) std::this_thread::yield();
        dropped = false;
        while (!w->test()) std::this_thread::yield();
        // done: its captures are gone, and the thread that ran it touches the queue only to let
        // exec_ go, which the destruction waits for
        CHECK(dropped.load());
        c = {};  // destroyed as soon as the call is done
        runner.join();
      }
    });
  }
  SECTION("a communicator whose last handle goes inside a continuation of its own") {
    // (its destruction joined the thread it ran on, or tore down the queue under it: it is
    // finished on a thread of its own)
    collx::launch_threads(1, [](auto& comm) {
      using comm_t = std::decay_t<decltype(comm)>;
      for (int i = 0; i < 5; ++i) {
        auto c = std::make_shared<comm_t>(comm.split(0, 0));
        std::atomic<bool> outer_gone{false}, done{false};
        comm_t& cc = *c;
        collx::async::run(cc, [](auto&) {}, [&, last = c](std::exception_ptr) mutable {
          while (!outer_gone.load()) std::this_thread::yield();
          last.reset();  // the last handle: the communicator goes from inside its own continuation
          done = true;
        }).detach();
        c.reset();
        outer_gone = true;
        while (!done.load()) std::this_thread::yield();
      }
      std::this_thread::sleep_for(50ms);  // their destruction, on threads of their own, finishes
    });
  }
}

TEST_CASE("calls submitted from several threads all run once each", "[async][then]") {
  // One rank: every call is local, so their order across threads does not matter, only that
  // none is lost or run twice while the queue takes them from four producers at once.
  constexpr int kThreads = 4, kEach = 300;
  std::atomic<int> ran{0};
  collx::launch_threads(1, [&](auto& comm) {
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&] {
        std::vector<collx::work> ws;
        for (int i = 0; i < kEach; ++i) {
          ws.push_back(collx::async::run(comm, [&](auto&) { ran.fetch_add(1); }));
          if (i % 7 == 0) ws.back().wait();
        }
        for (auto& w : ws) w.wait();
      });
    for (auto& t : ts) t.join();
  });
  CHECK(ran.load() == kThreads * kEach);
  // Several ranks, the calls issued from different threads in turn (the same order on every
  // rank): as torch issues them from Python's thread and from futures' callbacks.
  CHECK(run_checked<threads>(3, [](auto& comm, auto note) {
          std::vector<std::vector<int>> bufs(40, std::vector<int>(7, 1));
          std::vector<collx::work> ws(bufs.size());
          for (std::size_t i = 0; i < bufs.size(); ++i)
            std::thread([&, i] { ws[i] = collx::async::all_reduce(comm, std::span{bufs[i]}, collx::ops::sum{}); }).join();
          for (auto& w : ws) w.wait();
          for (const auto& b : bufs)
            if (b[0] != comm.size()) note("wrong sum");
        }) == "");
}

TEST_CASE("errors reach wait() with the blocking call's messages", "[async][errors]") {
  collx::options o;
  o.timeout = 300ms;
  SECTION("timeout: a rank that never makes the call") {
    std::string msg;
    std::mutex mu;
    try {
      collx::launch_threads(3, [&](auto& comm) {
        std::vector<int> v(10, 1);
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(700ms);
          return;
        }
        auto w = collx::async::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
        try {
          w.wait();
        } catch (const collx::error& e) {
          std::lock_guard lk(mu);
          if (msg.empty() || e.code() == collx::errc::timeout) msg = std::to_string(int(e.code().value())) + " " + e.what();
          throw;
        }
      }, o);
    } catch (const collx::error&) {
    }
    CAPTURE(msg);
    CHECK(msg.find("all_reduce #1 (ring)") != std::string::npos);
    CHECK(msg.find("timed out after 0.3 s waiting for rank") != std::string::npos);
  }
  SECTION("mismatch: ranks that issue different calls") {
    std::vector<std::string> got(2);
    try {
      collx::launch_threads(2, [&](auto& comm) {
        std::vector<int> v(comm.rank() == 0 ? 10 : 11, 1);
        auto w = collx::async::all_reduce(comm, std::span{v}, collx::ops::sum{});
        try {
          w.wait();
        } catch (const collx::error& e) {
          if (e.code() == collx::errc::mismatch) got[std::size_t(comm.rank())] = e.what();
          throw;
        }
      }, o);
    } catch (const collx::error&) {
    }
    CAPTURE(got[0], got[1]);
    CHECK((got[0].find("made different calls") != std::string::npos || got[1].find("made different calls") != std::string::npos));
  }
  SECTION("a SIGKILLed peer, over shm and tcp: peer_lost naming it") {
    // Each surviving rank writes what its wait() threw to a file of its own.
    const std::string base = (std::filesystem::temp_directory_path() / ("collx-test-async-" + std::to_string(getpid()) + "-")).string();
    auto body = [&](auto& comm) {
      std::vector<int> v(1000, 1);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{});  // everyone is up
      if (comm.rank() == 1) raise(SIGKILL);
      auto w = collx::async::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
      std::string out = "no error";
      try {
        w.wait();
      } catch (const collx::error& e) {
        out = std::to_string(e.code().value()) + " " + e.what();
      }
      std::FILE* f = std::fopen((base + std::to_string(comm.rank())).c_str(), "w");
      if (f) {
        std::fputs(out.c_str(), f);
        std::fclose(f);
      }
    };
    for (int t = 0; t < 2; ++t) {
      collx::options lo;
      lo.timeout = 20s;  // peer loss must be seen long before
      try {
        if (t == 0) collx::launch_processes(3, body, lo);
        else collx::launch_processes(3, body, lo, collx::transport::tcp_config{});
      } catch (const std::exception&) {  // rank 1's death
      }
      for (int r : {0, 2}) {
        std::string got;
        if (std::FILE* f = std::fopen((base + std::to_string(r)).c_str(), "r")) {
          char b[4096];
          got.assign(b, std::fread(b, 1, sizeof b, f));
          std::fclose(f);
        }
        std::remove((base + std::to_string(r)).c_str());
        CAPTURE(t, r, got);
        CHECK(got.rfind(std::to_string(int(collx::errc::peer_lost)) + " ", 0) == 0);
        CHECK(got.find("rank 1") != std::string::npos);
      }
    }
  }
}

TEST_CASE("a fused batch gives exactly what the separate calls give", "[fuse]") {
  for (int n : {1, 2, 3, 5, 7}) {
    CAPTURE(n);
    auto body = [n](auto& comm, auto note) {
      const int r = comm.rank();
      const std::size_t counts[] = {0, 1, std::size_t(n > 1 ? n - 1 : 3), std::size_t(n + 1), 1009, 64, 3};
      std::vector<std::vector<int>> sums, maxes, sep_sums, sep_maxes;
      for (std::size_t c : counts) {
        sums.push_back(inputs<int, collx::ops::sum>(r, c));
        maxes.push_back(inputs<int, collx::ops::max>(r, c + 2));
      }
      sep_sums = sums;
      sep_maxes = maxes;
      std::vector<float> fb(17, float(r)), sep_fb = fb;
      // Ring neighbours, both ways at once: separate synchronous sends would wait in turn.
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      std::vector<int> to_next(33, r * 10 + 1), to_prev(21, r * 10 + 2), from_prev(33), from_next(21);
      collx::fused f(comm);
      for (std::size_t i = 0; i < sums.size(); ++i) {
        f.all_reduce(std::span{sums[i]}, collx::ops::sum{});
        f.all_reduce(std::span{maxes[i]}, collx::ops::max{});
      }
      f.broadcast(std::span{fb}, n - 1);
      if (n > 1) f.send(std::span{to_next}, next).send(std::span{to_prev}, prev).recv(std::span{from_prev}, prev).recv(std::span{from_next}, next);
      f.run();
      for (std::size_t i = 0; i < sums.size(); ++i) {
        collx::all_reduce(comm, std::span{sep_sums[i]}, collx::ops::sum{});
        collx::all_reduce(comm, std::span{sep_maxes[i]}, collx::ops::max{});
        if (sums[i] != sep_sums[i]) note("sum " + std::to_string(i) + " differs from the separate call");
        if (maxes[i] != sep_maxes[i]) note("max " + std::to_string(i) + " differs from the separate call");
        note(compare(sums[i], reference<int>(collx::ops::sum{}, n, counts[i])));
      }
      collx::broadcast(comm, std::span{sep_fb}, n - 1);
      if (fb != sep_fb) note("broadcast differs");
      if (n > 1) {
        if (from_prev != std::vector<int>(33, prev * 10 + 1)) note("fused recv from prev wrong");
        if (from_next != std::vector<int>(21, next * 10 + 2)) note("fused recv from next wrong");
      }
      // The packs really are one call each: two all_reduce packs and a broadcast, then p2p
      // (no sequence number), take 3 collective sequence numbers.
      const auto before = comm.calls();
      collx::fused g(comm);
      for (auto& s : sums) g.all_reduce(std::span{s}, collx::ops::sum{});
      g.launch().wait();
      if (comm.calls() - before != 1 && n > 1) note("a pack of all-reduces took " + std::to_string(comm.calls() - before) + " calls");
      // A policy with parameters (ring's chunk size) packs too, by value (it took one call per
      // all-reduce before); out-of-place parts beside in-place ones, and avg, whose division
      // runs over the parts where they are.
      std::vector<std::vector<double>> ins, outs, seps;
      for (std::size_t c : counts) {
        ins.push_back(inputs<double, collx::ops::sum>(r, c + 1));
        outs.emplace_back(c + 1, -1.0);
      }
      std::vector<double> inplace = inputs<double, collx::ops::sum>(r, 77), sep_inplace = inplace;
      const auto before_ring = comm.calls();
      collx::fused h(comm);
      for (std::size_t i = 0; i < ins.size(); ++i) {
        h.all_reduce(std::span<const double>{ins[i]}, std::span{outs[i]}, collx::ops::avg{}, collx::algo::ring{});
        if (i == 2) h.all_reduce(std::span{inplace}, collx::ops::avg{}, collx::algo::ring{});
      }
      h.all_reduce(std::span{fb}, collx::ops::sum{}, collx::algo::ring{2048});  // other parameters: a pack of its own
      h.run();
      if (comm.calls() - before_ring != 2 && n > 1)
        note("two ring packs took " + std::to_string(comm.calls() - before_ring) + " calls");
      for (std::size_t i = 0; i < ins.size(); ++i) {
        std::vector<double> sep(ins[i].size());
        collx::all_reduce(comm, std::span<const double>{ins[i]}, std::span{sep}, collx::ops::avg{}, collx::algo::ring{});
        if (sep != outs[i]) note("fused out-of-place avg " + std::to_string(i) + " differs from the separate call");
      }
      collx::all_reduce(comm, std::span{sep_inplace}, collx::ops::avg{}, collx::algo::ring{});
      if (sep_inplace != inplace) note("fused in-place avg differs from the separate call");
    };
    CHECK(run_checked<threads>(n, body) == "");
    CHECK(run_checked<processes>(n, body) == "");
    if (n <= 5) CHECK(run_checked<processes_tcp>(n, body) == "");
  }
}

/// A transport that moves no spread operands (as transport::cuda): a fused batch packs its
/// all-reduces into a pack buffer and back (features/fuse.hpp), which no host transport otherwise takes.
template <class T>
struct packs_only : T {
  explicit packs_only(T t) : T(std::move(t)) {}
  bool takes_pieces() const noexcept { return false; }
};

TEST_CASE("a fused batch over a transport that takes no pieces packs its all-reduces and unpacks them right", "[fuse]") {
  for (int n : {1, 2, 3, 5}) {
    CAPTURE(n);
    std::vector<std::string> notes(static_cast<std::size_t>(n));
    collx::launch_threads<packs_only>(n, [&](auto& comm) {
      static_assert(std::is_same_v<std::decay_t<decltype(comm.transport())>, packs_only<collx::transport::inproc>>);
      const int r = comm.rank();
      std::string& note = notes[std::size_t(r)];
      // Counts that do not divide evenly, a zero-sized part among them; in place and out of place.
      const std::size_t counts[] = {0, 1, std::size_t(n + 1), 1009, 7};
      std::vector<std::vector<int>> bufs, ins, outs;
      for (std::size_t c : counts) {
        bufs.push_back(inputs<int, collx::ops::sum>(r, c));
        ins.push_back(inputs<int, collx::ops::sum>(r + 1, c + 3));
        outs.emplace_back(c + 3, -1);
      }
      collx::fused f(comm);
      for (std::size_t i = 0; i < bufs.size(); ++i) {
        f.all_reduce(std::span{bufs[i]}, collx::ops::sum{});
        f.all_reduce(std::span<const int>{ins[i]}, std::span{outs[i]}, collx::ops::sum{});
      }
      f.run();
      for (std::size_t i = 0; i < bufs.size() && note.empty(); ++i) {
        note = compare(bufs[i], reference<int>(collx::ops::sum{}, n, counts[i]));
        if (note.empty()) {
          std::vector<int> want(counts[i] + 3, 0);
          for (int q = 0; q < n; ++q) {
            const auto in = inputs<int, collx::ops::sum>(q + 1, counts[i] + 3);
            for (std::size_t j = 0; j < want.size(); ++j) want[j] += in[j];
          }
          note = compare(outs[i], want);
          if (note.empty() && ins[i] != inputs<int, collx::ops::sum>(r + 1, counts[i] + 3)) note = "an input was modified";
        }
        if (!note.empty()) note = "part " + std::to_string(i) + ": " + note;
      }
    });
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      CHECK(notes[std::size_t(r)] == "");
    }
  }
}

TEST_CASE("gradient buckets: reverse order, caps, and results equal a plain all_reduce of each gradient", "[buckets]") {
  // Uneven layers, as a model has them (in elements of 4 B): the caps below split them in
  // several buckets, one gradient is larger than a bucket.
  const std::vector<std::size_t> sizes{3, 70000, 1, 5000, 123457, 0, 260000, 17, 4096, 65536, 9};
  collx::bucket_options o;
  o.cap_bytes = 256 << 10;
  o.first_cap_bytes = 64 << 10;
  auto body = [&](auto& comm, auto note) {
    const int r = comm.rank(), n = comm.size();
    std::vector<std::vector<int>> grads(sizes.size());
    std::vector<std::span<int>> views;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      grads[k].resize(sizes[k]);
      views.emplace_back(grads[k]);
    }
    collx::bucket_reducer<typename std::decay_t<decltype(comm)>::transport_type, int, collx::ops::sum> red(comm, views, o);
    // The assignment: reverse order of creation, every bucket within its cap unless it holds one gradient.
    const auto a = red.assignment();
    std::size_t expect_next = sizes.size();
    for (std::size_t b = 0; b < a.size(); ++b) {
      std::size_t bytes = 0, nonempty = 0;
      for (std::size_t k : a[b]) {
        if (k + 1 != expect_next) note("bucket " + std::to_string(b) + " is not in reverse order");
        expect_next = k;
        bytes += sizes[k] * 4;
        nonempty += sizes[k] != 0;
      }
      const std::size_t cap = b == 0 ? o.first_cap_bytes : o.cap_bytes;
      if (bytes > cap && nonempty > 1) note("bucket " + std::to_string(b) + " holds " + std::to_string(bytes) + " B, over its cap");
      if (b + 1 < a.size()) {  // it closed because the next gradient did not fit
        const std::size_t next = a[b + 1].front();
        if (bytes + sizes[next] * 4 <= cap) note("bucket " + std::to_string(b) + " closed early");
      }
    }
    if (a.size() < 4) note("expected several buckets, got " + std::to_string(a.size()));
    std::mt19937 rng(unsigned(12345));  // the same on every rank: orders differ by step, not by rank
    for (int step = 0; step < 3; ++step) {
      for (std::size_t k = 0; k < sizes.size(); ++k)
        for (std::size_t i = 0; i < sizes[k]; ++i) grads[k][i] = int((i * 31 + k * 7 + std::size_t(r) * 13 + std::size_t(step)) % 1000);
      auto plain = grads;
      std::vector<std::size_t> order(sizes.size());
      std::iota(order.begin(), order.end(), 0);
      if (step == 0) std::reverse(order.begin(), order.end());  // as backward produces them
      else std::shuffle(order.begin(), order.end(), rng);        // any order: buckets still start in order
      // Each rank marks them in its own order too (ranks' backward passes race).
      if (r % 2 == 1) std::reverse(order.begin(), order.end());
      for (std::size_t k : order) red.ready(k);
      red.finish();
      for (auto& g : plain) collx::all_reduce(comm, std::span{g}, collx::ops::sum{});
      for (std::size_t k = 0; k < sizes.size(); ++k)
        if (grads[k] != plain[k]) {
          note("step " + std::to_string(step) + " gradient " + std::to_string(k) + " differs from its plain all_reduce");
          break;
        }
    }
    (void)n;
    // finish() before every gradient is ready is an error that names them.
    red.ready(0);
    try {
      red.finish();
      note("finish() with gradients missing did not fail");
    } catch (const collx::error& e) {
      if (std::string(e.what()).find("gradient(s) 1, 2") == std::string::npos) note(std::string("wrong message: ") + e.what());
    }
    // After the error the reducer starts afresh: a whole step gives the plain results again.
    for (std::size_t k = 0; k < sizes.size(); ++k)
      for (std::size_t i = 0; i < sizes[k]; ++i) grads[k][i] = int((i + k + std::size_t(r)) % 97);
    auto plain = grads;
    for (std::size_t k = sizes.size(); k-- > 0;) red.ready(k);
    red.finish();
    for (auto& g : plain) collx::all_reduce(comm, std::span{g}, collx::ops::sum{});
    if (grads != plain) note("the step after a failed finish() is wrong");
  };
  for (int n : {1, 2, 3, 5}) {
    CAPTURE(n);
    CHECK(run_checked<threads>(n, body) == "");
    CHECK(run_checked<processes>(n, body) == "");
  }
  CHECK(run_checked<processes_tcp>(3, body) == "");
}

TEST_CASE("buckets with the default avg over floats: the mean of every rank's gradient", "[buckets]") {
  CHECK(run_checked<processes>(4, [](auto& comm, auto note) {
          std::vector<std::vector<float>> g{std::vector<float>(300000), std::vector<float>(5), std::vector<float>(1 << 19)};
          std::vector<std::span<float>> v(g.begin(), g.end());
          collx::bucket_reducer red(comm, v);  // deduced: avg over float
          for (auto& x : g) std::fill(x.begin(), x.end(), float(comm.rank() * 2));
          for (std::size_t k = g.size(); k-- > 0;) red.ready(k);
          red.finish();
          for (auto& x : g)
            for (float y : x)
              if (y != 3.0f) {
                note("avg wrong: " + std::to_string(y));
                return;
              }
          if (red.buckets() != 2) note("25 MiB caps with a 1 MiB first: expected 2 buckets, got " + std::to_string(red.buckets()));
          // Gradients as views of the buckets (DDP's gradient_as_bucket_view): no copies, same result.
          red.rebind_to_views();
          for (std::size_t k = 0; k < g.size(); ++k) {
            auto view = red.gradient(k);
            if (view.data() != red.bucket_view(k).data() || view.size() != g[k].size()) note("rebind_to_views: wrong span");
            std::fill(view.begin(), view.end(), float(comm.rank() + 1));
          }
          for (std::size_t k = g.size(); k-- > 0;) red.ready(k);
          red.finish();
          for (std::size_t k = 0; k < g.size(); ++k)
            for (float y : red.gradient(k))
              if (y != 2.5f) {
                note("views: avg wrong: " + std::to_string(y));
                return;
              }
        }) == "");
}
