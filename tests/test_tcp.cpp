// transport::tcp: the core's test matrix over real processes and loopback sockets, and what
// only sockets can show: rendezvous through both stores, strangers refused, garbage on the wire,
// a peer killed, reset, stopped mid-message or late.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fcntl.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <thread>

#include "harness.hpp"
#include "scratch.hpp"
#include "matrix.hpp"
#include "stress.hpp"

using namespace collx_test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
namespace algo = collx::algo;
namespace net = collx::transport::net;

TEMPLATE_TEST_CASE("over tcp: reducing collectives equal the serial reference", "[tcp]", algo::ring, algo::tree,
                   algo::recursive_halving, algo::automatic) {
  check_reducing_matrix<processes_tcp, TestType>();
}

TEMPLATE_TEST_CASE("over tcp: data-moving collectives deliver every block", "[tcp]", algo::ring, algo::tree,
                   algo::recursive_halving, algo::pairwise, algo::automatic) {
  check_moving_matrix<processes_tcp, TestType>();
}

TEST_CASE("over tcp with TLS: collectives equal the serial reference", "[tcp][tls]") {
  scoped_env tls("COLLX_TCP_TLS", "1");  // (launch_processes draws the job's secret, which keys TLS)
  REQUIRE(collx::transport::tcp_config{}.tls);
  check_reducing_matrix<processes_tcp, algo::automatic>();
  check_moving_matrix<processes_tcp, algo::ring>();
  CHECK(run_all_to_all_v<processes_tcp>(5) == "");
}

TEST_CASE("over tcp: every dtype and op, and all_to_all_v with uneven blocks", "[tcp]") {
  for (int n : {3, 5}) {
    check_dtypes_and_ops<processes_tcp>(n);
    CHECK(run_all_to_all_v<processes_tcp>(n) == "");
  }
}

namespace {
/// Open file descriptors of this process (sockets included).
int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

/// Runs rank r of an n-rank job on a thread of this process per rank, through a file store in
/// `dir`; body(comm) runs on each. Returns each rank's error message ("" when it succeeded).
template <class Body>
std::vector<std::string> run_threads_tcp(int n, const std::string& dir, collx::transport::tcp_config cfg, collx::options o,
                                         Body body) {
  std::vector<std::string> err(static_cast<std::size_t>(n));
  std::vector<std::thread> ts;
  cfg.store_path = dir;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        collx::communicator<collx::transport::tcp> comm{collx::transport::tcp("threads-job", r, n, cfg), o};
        try {
          body(comm);
        } catch (const std::exception& e) {
          comm.transport().abort(e.what());
          throw;
        }
      } catch (const std::exception& e) {
        err[std::size_t(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return err;
}
}  // namespace

TEST_CASE("over tcp: a file store works as the rendezvous, and every socket is closed afterwards", "[tcp]") {
  const int before = open_fds();
  {
    temp_dir d;
    collx::options o;
    o.timeout = 20s;
    auto err = run_threads_tcp(3, d.path, {}, o, [](auto& comm) {
      std::vector<int> v(1000, comm.rank() + 1);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
      if (v[999] != 6) throw std::runtime_error("wrong sum");
    });
    for (auto& e : err) CHECK(e == "");
    // The job's keys are gone once every rank is through, so the same job name can run again.
    std::size_t left = 0;
    for (const auto& e : std::filesystem::directory_iterator(d.path)) left += e.path().filename().string()[0] == 'k';
    CHECK(left == 0);
    err = run_threads_tcp(3, d.path, {}, o, [](auto& comm) { collx::barrier(comm); });
    for (auto& e : err) CHECK(e == "");
    // A failing job (mismatched counts) releases its sockets as well.
    err = run_threads_tcp(3, d.path + "/second", {}, o, [](auto& comm) {
      std::vector<int> v(comm.rank() == 1 ? 7 : 5, 1);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    });
    CHECK_THAT(err[0] + err[1] + err[2], Contains("7 x 4 B") && Contains("5 x 4 B"));
  }
  CHECK(open_fds() == before);
}

TEST_CASE("over tcp: a rerun after a crash starts clean, though the file store kept the crashed run's keys", "[tcp][faults][stale]") {
  temp_dir d;
  {  // what a crashed run of "threads-job" leaves: its token, its ranks' addresses, a count of ready ranks
    collx::transport::file_store st(d.path);
    st.set("threads-job/token", "a-token-of-the-crashed-run");
    auto [l, at] = collx::transport::net::listen_on(collx::transport::net::resolve("127.0.0.1", 0));
    st.set("threads-job/addr/0", at.str() + " elsewhere 0,");  // nobody answers there any more once l closes
    st.set("threads-job/addr/1", at.str() + " elsewhere 0,");
    st.add("threads-job/ready", 2);
  }
  // The rerun: ranks 1 and 2 start first and could read those keys; rank 0 comes 300 ms later.
  collx::transport::tcp_config cfg;
  cfg.store_path = d.path;
  collx::options o;
  o.timeout = 20s;
  cfg.rendezvous_timeout = 20s;
  std::vector<std::string> err(3);
  std::vector<std::thread> ts;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r : {1, 2, 0}) {
    if (r == 0) std::this_thread::sleep_for(300ms);
    ts.emplace_back([&, r] {
      try {
        collx::communicator<collx::transport::tcp> comm{collx::transport::tcp("threads-job", r, 3, cfg), o};
        std::vector<int> v(100, 1);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
        if (v[99] != 3) err[std::size_t(r)] = "wrong sum";
      } catch (const std::exception& e) {
        err[std::size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (auto& e : err) CHECK(e == "");
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
}

TEST_CASE("over tcp: rendezvous names the ranks that did not show up", "[tcp][faults]") {
  temp_dir d;
  collx::transport::tcp_config cfg;
  cfg.rendezvous_timeout = 1s;
  cfg.store_path = d.path;
  // Ranks 0 and 1 of 3 come; rank 2 never does.
  std::vector<std::string> err(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        collx::transport::tcp t("absent", r, 3, cfg);
      } catch (const collx::error& e) {
        err[std::size_t(r)] = std::to_string(int(e.code().value())) + " " + e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : err) {
    CHECK_THAT(e, Contains("rank(s) 2"));
    CHECK_THAT(e, Contains("timed out"));
  }
}

TEST_CASE("over tcp: mismatched calls fail with errc::mismatch", "[tcp][mismatch]") {
  check_mismatches([](int n, auto f, const collx::options& o) { collx::launch_processes(n, f, o, collx::transport::tcp_config{}); });
}

TEST_CASE("over tcp: a rank killed mid-collective is reported by every other rank within seconds", "[tcp][faults]") {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    collx::options o;
    o.timeout = 60s;  // detection must not wait for the timeout
    collx::launch_processes(4, [](auto& comm) {
      std::vector<float> v(1 << 22, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      if (comm.rank() == 2) {  // die in the middle of the next one
        std::thread([] {
          std::this_thread::sleep_for(5ms);
          raise(SIGKILL);
        }).detach();
      }
      for (int i = 0; i < 100; ++i) collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    }, o, collx::transport::tcp_config{});
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::peer_lost);
    CHECK_THAT(e.what(), Contains("rank 2") && Contains("signal 9"));
    CHECK_THAT(e.what(), Contains("4 ranks failed"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
}

TEST_CASE("over tcp: a reset connection is reported as the loss of that rank", "[tcp][faults]") {
  try {
    collx::options o;
    o.timeout = 60s;
    collx::launch_processes(3, [](auto& comm) {
      std::vector<float> v(1000, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      if (comm.rank() == 1) {
        // Abort every connection with a reset (SO_LINGER 0), then stay alive.
        for (int f = 3; f < 1024; ++f) {
          int type = 0;
          socklen_t len = sizeof type;
          if (getsockopt(f, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
          linger l{1, 0};
          setsockopt(f, SOL_SOCKET, SO_LINGER, &l, sizeof l);
          close(f);
        }
        std::this_thread::sleep_for(3s);
        return;
      }
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    }, o, collx::transport::tcp_config{});
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::peer_lost);
    CHECK_THAT(e.what(), Contains("lost rank 1"));
  }
}

TEST_CASE("over tcp: a rank stopped mid-message, or late, runs its peers into their deadline, naming it", "[tcp][faults]") {
  collx::options o;
  o.timeout = 2s;
  SECTION("stopped (SIGSTOP) in the middle of a 64 MiB all-reduce") {
    try {
      collx::launch_processes(3, [](auto& comm) {
        if (comm.rank() == 1) {
          if (fork() == 0) {  // a watchdog that ends the stopped rank after its peers gave up
            std::this_thread::sleep_for(6s);
            kill(getppid(), SIGKILL);
            _exit(0);
          }
          std::thread([] {
            std::this_thread::sleep_for(20ms);
            raise(SIGSTOP);
          }).detach();
        }
        std::vector<float> v(1 << 24, 1.0f);
        for (int i = 0; i < 50; ++i) collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      }, o, collx::transport::tcp_config{});
      FAIL("no error");
    } catch (const collx::error& e) {
      CHECK(e.code() == collx::errc::timeout);
      CHECK_THAT(e.what(), Contains("waiting for rank 1"));
    }
  }
  SECTION("a straggler") {
    try {
      collx::launch_processes(3, [](auto& comm) {
        if (comm.rank() == 2) std::this_thread::sleep_for(4s);
        std::vector<float> v(1000, 1.0f);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      }, o, collx::transport::tcp_config{});
      FAIL("no error");
    } catch (const collx::error& e) {
      CHECK(e.code() == collx::errc::timeout);
      CHECK_THAT(e.what(), Contains("waiting for rank 2"));
    }
  }
}

namespace {

/// Connects to rank `r`'s published address in a file store, as anyone who can read it could.
net::fd connect_to_rank(const std::string& dir, const std::string& job, int r) {
  collx::transport::file_store st(dir);
  const auto v = st.get(job + "/addr/" + std::to_string(r), net::clock::now() + 10s);
  REQUIRE(v);
  std::string why;
  net::fd s = net::connect_until(net::parse_host_port(v->substr(0, v->find(' '))), net::clock::now() + 10s, why);
  REQUIRE(s);
  return s;
}

/// Asks to be admitted as rank `rank` of `size` in job `job` by rank `to` on connection s, proving
/// with `secret` (tcp/auth.hpp), as a rank or a stranger would: the verdict's code, or -1 if the
/// connection closed without one.
int admit_as(net::fd& s, const std::string& job, int rank, int size, int to, const std::string& secret) {
  namespace wire = collx::transport::tcp_wire;
  namespace auth = collx::transport::tcp_auth;
  const auto dl = net::clock::now() + 10s;
  wire::hello h;
  h.rank = std::uint32_t(rank);
  h.size = std::uint32_t(size);
  const auto nc = auth::fresh_nonce();
  std::memcpy(h.nonce, nc.data(), nc.size());
  REQUIRE(net::write_all(s.get(), &h, sizeof h, dl) == net::io::ok);
  wire::challenge c;
  if (net::read_exact(s.get(), &c, sizeof(wire::verdict), dl) != net::io::ok) return -1;
  if (c.magic == wire::kVerdictMagic) return int(reinterpret_cast<const wire::verdict&>(c).code);
  if (net::read_exact(s.get(), reinterpret_cast<char*>(&c) + sizeof(wire::verdict), sizeof c - sizeof(wire::verdict), dl) != net::io::ok) return -1;
  auth::nonce na;
  std::memcpy(na.data(), c.nonce, na.size());
  const std::string ctx = collx::transport::tcp_detail::rendezvous::context(job, rank, to, size);
  const std::span<const std::byte> hb(reinterpret_cast<const std::byte*>(&h), sizeof h);
  // (a rank checks the acceptor's proof: with the right secret it holds)
  if (!secret.empty() && secret != "a-guess") CHECK(auth::same({c.mac, wire::kMac}, auth::accept_proof(secret, ctx, hb, na)));
  wire::proof p;
  const auto m = auth::connect_proof(secret, ctx, hb, na);
  std::memcpy(p.mac, m.data(), m.size());
  REQUIRE(net::write_all(s.get(), &p, sizeof p, dl) == net::io::ok);
  wire::verdict v;
  if (net::read_exact(s.get(), &v, sizeof v, dl) != net::io::ok) return -1;
  return int(v.code);
}

/// A fake rank 1 of a 2-rank job meeting in the file store `dir`: publishes an address (a
/// listener that never answers), and is admitted by rank 0 with `secret`. Its connection to
/// rank 0, and the listener.
std::pair<net::fd, net::fd> fake_rank_1(const std::string& dir, const std::string& job, const std::string& secret) {
  auto [l, at] = net::listen_on(net::resolve("127.0.0.1", 0));
  collx::transport::file_store st(dir);
  net::fd s = connect_to_rank(dir, job, 0);  // rank 0 has claimed the store by now
  st.set(job + "/addr/1", at.str() + " elsewhere 0,");
  REQUIRE(admit_as(s, job, 1, 2, 0, secret) == 0);
  return {std::move(s), std::move(l)};
}

/// Sends `n` bytes as a hello and returns the verdict's code, or -1 if the connection closed
/// without one.
int verdict_for(net::fd& s, const void* hello_bytes) {
  const auto dl = net::clock::now() + 10s;
  REQUIRE(net::write_all(s.get(), hello_bytes, sizeof(collx::transport::tcp_wire::hello), dl) == net::io::ok);
  collx::transport::tcp_wire::verdict v;
  if (net::read_exact(s.get(), &v, sizeof v, dl) != net::io::ok) return -1;
  return int(v.code);
}

/// A job that rendezvouses in a file store in `dir` with a token of its own.
collx::transport::tcp_config guarded_config(const std::string& dir) {
  collx::transport::tcp_config cfg;
  cfg.store_path = dir;
  cfg.token = "the-job-token";
  cfg.rendezvous_timeout = 20s;
  return cfg;
}
}  // namespace

TEST_CASE("over tcp: strangers are refused and logged, and the job runs as if they never came", "[tcp][security]") {
  temp_dir d;
  stderr_capture cap;
  const collx::transport::tcp_config cfg = guarded_config(d.path);
  std::string err0, err1;
  std::vector<int> got0, got1;
  auto rank = [&](int r, std::string& err, std::vector<int>& got) {
    try {
      collx::communicator<collx::transport::tcp> comm{collx::transport::tcp("guarded", r, 2, cfg)};
      got.assign(100, r + 1);
      collx::all_reduce(comm, std::span{got}, collx::ops::sum{});
    } catch (const std::exception& e) {
      err = e.what();
    }
  };
  std::thread r0(rank, 0, std::ref(err0), std::ref(got0));
  {
    net::fd s = connect_to_rank(d.path, "guarded", 0);
    CHECK(admit_as(s, "guarded", 1, 2, 0, "a-guess") == int(collx::transport::tcp_wire::verdict_code::bad_token));
  }
  {
    net::fd s = connect_to_rank(d.path, "guarded", 0);
    std::vector<unsigned char> junk(sizeof(collx::transport::tcp_wire::hello), 0xab);
    CHECK(verdict_for(s, junk.data()) == int(collx::transport::tcp_wire::verdict_code::bad_version));
  }
  {
    net::fd s = connect_to_rank(d.path, "guarded", 0);  // the right secret, a rank that does not exist
    CHECK(admit_as(s, "guarded", 7, 2, 0, "the-job-token") == int(collx::transport::tcp_wire::verdict_code::bad_rank));
  }
  { net::fd s = connect_to_rank(d.path, "guarded", 0); }  // connects and leaves without a word
  std::thread r1(rank, 1, std::ref(err1), std::ref(got1));
  r0.join();
  r1.join();
  CHECK(err0 == "");
  CHECK(err1 == "");
  CHECK(got0 == std::vector<int>(100, 3));
  CHECK(got1 == std::vector<int>(100, 3));
  const std::string log = cap.text();
  CHECK_THAT(log, Contains("refused a connection from 127.0.0.1") && Contains("could not prove it holds the job's secret"));
  CHECK_THAT(log, Contains("not a collx peer"));
  CHECK_THAT(log, Contains("rank out of range"));
  CHECK_THAT(log, Contains("closed before its hello"));
}

TEST_CASE("over tcp: a shrink's hello or a position query that reaches a rank still in its rendezvous waits for its communicator", "[tcp][shrink]") {
  // A rank that is done with its rendezvous may shrink at once, or time out and ask where its
  // peers are, while a slower rank still admits the others on the same listener. That rank's
  // rendezvous once read a shrink's hello as a stranger's and refused it ("not a collx peer of
  // this version"), failing the shrink of a job where no rank had failed.
  namespace wire = collx::transport::tcp_wire;
  temp_dir d;
  stderr_capture cap;
  const collx::transport::tcp_config cfg = guarded_config(d.path);
  std::atomic<int> made{0};
  std::atomic<bool> done{false};
  std::string err[2];
  auto rank = [&](int r) {
    try {
      collx::communicator<collx::transport::tcp> comm{collx::transport::tcp("early", r, 2, cfg)};
      made.fetch_add(1);
      while (!done.load()) std::this_thread::sleep_for(5ms);
    } catch (const std::exception& e) {
      err[r] = e.what();
      made.fetch_add(1);
    }
  };
  std::thread r0(rank, 0), r1;
  struct joiner {  // (a REQUIRE that fails leaves no thread running)
    std::atomic<bool>& done;
    std::thread &a, &b;
    ~joiner() {
      done.store(true);
      if (a.joinable()) a.join();
      if (b.joinable()) b.join();
    }
  } join_at_end{done, r0, r1};
  // Rank 0 waits in its rendezvous for rank 1: as rank 1 would once it is past its own, this
  // says a shrink's hello to rank 0, and asks rank 0 where it is.
  net::fd hello = connect_to_rank(d.path, "early", 0);
  // (what a shrink's hello and a query prove is bound to the run's name, which rank 0 drew)
  const auto session = collx::transport::file_store(d.path).get("early/session", net::clock::now() + 10s);
  REQUIRE(session);
  const std::string proven = "early#" + *session;
  wire::shrink_hello h;
  h.rank = 1;
  h.size = 2;
  h.epoch = 1;
  h.job = collx::detail::fnv1a(proven);
  const auto hm = collx::transport::tcp_detail::shrink_mac(cfg.token, proven, h, 0);
  std::memcpy(h.mac, hm.data(), hm.size());
  REQUIRE(net::write_all(hello.get(), &h, sizeof h, net::clock::now() + 5s) == net::io::ok);
  net::fd query = connect_to_rank(d.path, "early", 0);
  wire::position_query q;
  q.rank = 1;
  q.size = 2;
  q.job = collx::detail::fnv1a("early");
  const auto qm = collx::transport::tcp_detail::query_mac(cfg.token, proven, q, 0);
  std::memcpy(q.mac, qm.data(), qm.size());
  REQUIRE(net::write_all(query.get(), &q, sizeof q, net::clock::now() + 5s) == net::io::ok);
  // And one that has said nothing yet when the rendezvous ends (a shrink writes its hello once
  // its connection is up): kept too, not closed unread.
  net::fd late = connect_to_rank(d.path, "early", 0);
  std::this_thread::sleep_for(300ms);  // (what a rendezvous that took them for its own had done by now: refused both)
  r1 = std::thread(rank, 1);
  while (made.load() < 2) std::this_thread::sleep_for(5ms);
  CHECK(err[0] == "");
  CHECK(err[1] == "");
  // The query is answered once rank 0's communicator is made: rank 0 has made no call yet.
  wire::position_answer a;
  const bool answered = net::read_exact(query.get(), &a, sizeof a, net::clock::now() + 5s) == net::io::ok;
  CHECK(answered);
  CHECK((answered && a.magic == wire::kAnswerMagic && a.seq_state == 0));
  CHECK(net::write_all(late.get(), &q, sizeof q, net::clock::now() + 5s) == net::io::ok);
  const bool late_answered = net::read_exact(late.get(), &a, sizeof a, net::clock::now() + 5s) == net::io::ok;
  CHECK(late_answered);
  CHECK((late_answered && a.magic == wire::kAnswerMagic));
  // The hello is set aside unread for rank 0's shrink: no verdict comes, and it stays open.
  pollfd pf{hello.get(), POLLIN, 0};
  CHECK(::poll(&pf, 1, 300) == 0);
  done.store(true);
  r0.join();
  r1.join();
  // Once rank 0's communicator goes, so does the connection it kept.
  char c;
  CHECK(net::read_exact(hello.get(), &c, 1, net::clock::now() + 5s) != net::io::ok);
  CHECK_THAT(cap.text(), !Contains("refused a connection"));
}

TEST_CASE("over tcp: garbage from an admitted peer is an error naming it, never a crash or a huge allocation", "[tcp][security]") {
  using namespace collx::transport;
  for (int variant = 0; variant < 3; ++variant) {
    CAPTURE(variant);
    temp_dir d;
    tcp_config cfg;
    cfg.store_path = d.path;
    cfg.token = "tok";
    std::string err;
    int code = 0;
    std::thread r0([&] {
      try {
        collx::options o;
        o.timeout = 10s;
        collx::communicator<tcp> comm{tcp("garbage", 0, 2, cfg), o};
        std::vector<float> v(1000, 1.0f);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      } catch (const collx::error& e) {
        err = e.what();
        code = e.code().value();
      }
    });
    // A fake rank 1: publishes an address, connects with the right secret, then sends junk.
    auto [s, l] = fake_rank_1(d.path, "garbage", "tok");
    tcp_wire::msg_header m;
    if (variant == 0) m.magic = 0xabababab;                    // no magic
    if (variant == 1) m.kind = 99;                                            // unknown kind
    if (variant == 2) { m.kind = std::uint32_t(tcp_wire::msg_kind::abort); m.bytes = std::uint64_t(1) << 60; }  // a huge reason
    REQUIRE(net::write_all(s.get(), &m, sizeof m, net::clock::now() + 5s) == net::io::ok);
    r0.join();
    CHECK(code == int(collx::errc::transport_error));
    CHECK_THAT(err, Contains("garbage on the connection from rank 1"));
  }
}

TEST_CASE("over tcp: a peer that trickles a byte now and then cannot keep a call open past options::call_timeout", "[tcp][security]") {
  // Before: each byte counted as progress and restarted options::timeout, so one byte just
  // inside each timeout kept the call open for ever.
  using namespace collx::transport;
  temp_dir d;
  tcp_config cfg;
  cfg.store_path = d.path;
  cfg.token = "tok";
  std::string err;
  double took = 0;
  std::atomic<bool> over{false};
  std::thread r0([&] {
    try {
      collx::options o;
      o.timeout = 1s;
      o.call_timeout = 3s;
      collx::communicator<tcp> comm{tcp("trickle", 0, 2, cfg), o};
      std::vector<float> v(1000, 1.0f);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      } catch (const collx::error& e) {
        took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        err = e.what();
        CHECK(e.code() == collx::errc::timeout);
      }
    } catch (const std::exception& e) {
      err = e.what();
    }
    over.store(true);
  });
  // A fake rank 1: admitted, then a byte of a message header every 300 ms (never a whole one).
  auto [s, l] = fake_rank_1(d.path, "trickle", "tok");
  for (int i = 0; i < 60 && !over.load(); ++i) {
    const char zero = 0;
    if (net::write_all(s.get(), &zero, 1, net::clock::now() + 1s) != net::io::ok) break;
    std::this_thread::sleep_for(300ms);
  }
  r0.join();
  CHECK_THAT(err, Contains("timed out after 3 s (the whole call's deadline, options::call_timeout) waiting for rank 1"));
  CHECK(took < 6.0);
}

TEST_CASE("over tcp: the rendezvous store refuses clients that cannot prove they hold the job's secret, and garbage", "[tcp][security]") {
  using namespace collx::transport;
  auto listening = net::listen_on(net::resolve("127.0.0.1", 0));
  auto& l = listening.first;  // not structured bindings: the lambdas below capture them (clang 14)
  const auto& at = listening.second;
  stderr_capture cap;
  tcp_config cfg;
  cfg.master_addr = "127.0.0.1";
  cfg.master_port = at.port();
  cfg.token = "store-secret";
  std::string err0, err1;
  std::vector<int> got0, got1;
  auto rank = [&](int r, std::string& err, std::vector<int>& got) {
    try {
      tcp_config c = cfg;
      if (r == 0) c.serve_store_fd = dup(l.get());
      collx::communicator<tcp> comm{tcp("stored", r, 2, c)};
      got.assign(10, r + 1);
      collx::all_reduce(comm, std::span{got}, collx::ops::sum{});
    } catch (const std::exception& e) {
      err = e.what();
    }
  };
  std::thread r0(rank, 0, std::ref(err0), std::ref(got0));
  auto dl = [] { return net::clock::now() + 10s; };
  auto reply_to = [&](const std::string& bytes) -> int {  // the reply's status, or -1: dropped
    std::string why;
    net::fd s = net::connect_until(at, dl(), why);
    REQUIRE(s);
    REQUIRE(net::write_all(s.get(), bytes.data(), bytes.size(), dl()) == net::io::ok);
    tcp_wire::store_rep_header h;
    if (net::read_exact(s.get(), &h, sizeof h, dl()) != net::io::ok) return -1;
    return int(h.status);
  };
  CHECK(reply_to(std::string(64, 'x')) == -1);  // garbage: dropped
  CHECK(reply_to(tcp_wire::encode_store_request(tcp_wire::store_op::get, "stored/addr/0", "")) == 1);  // no login: denied
  CHECK(reply_to(tcp_wire::encode_store_request(tcp_wire::store_op::auth, "auth", std::string(32, 'g'))) == 1);  // a proof, unasked
  {  // a login with a guessed proof: the challenge comes, the proof is refused
    std::string why;
    net::fd s = net::connect_until(at, dl(), why);
    REQUIRE(s);
    const std::string bytes = tcp_wire::encode_store_request(tcp_wire::store_op::auth_begin, "auth", std::string(32, 'n')) +
                              tcp_wire::encode_store_request(tcp_wire::store_op::auth, "auth", std::string(32, 'g'));
    REQUIRE(net::write_all(s.get(), bytes.data(), bytes.size(), dl()) == net::io::ok);
    tcp_wire::store_rep_header h;
    REQUIRE(net::read_exact(s.get(), &h, sizeof h, dl()) == net::io::ok);
    CHECK(h.status == 0);
    CHECK(h.value_len == 64);  // the store's nonce and proof
    std::string v(h.value_len, '\0');
    REQUIRE(net::read_exact(s.get(), v.data(), v.size(), dl()) == net::io::ok);
    REQUIRE(net::read_exact(s.get(), &h, sizeof h, dl()) == net::io::ok);
    CHECK(h.status == 1);
  }
  std::string huge = tcp_wire::encode_store_request(tcp_wire::store_op::set, "k", "v");
  const std::uint32_t big = 0x7fffffff;
  std::memcpy(huge.data() + 12, &big, sizeof big);  // announces a 2 GiB value
  CHECK(reply_to(huge) == -1);
  std::thread r1(rank, 1, std::ref(err1), std::ref(got1));
  r0.join();
  r1.join();
  CHECK(err0 == "");
  CHECK(err1 == "");
  CHECK(got0 == std::vector<int>(10, 3));
  CHECK_THAT(cap.text(), Contains("tcp store: refused") && Contains("asked before proving it holds the job's secret") &&
                             Contains("could not prove it holds the job's secret") && Contains("a proof without a challenge"));
}

TEST_CASE("over tcp: hundreds of back-to-back collectives, large among small, stay correct", "[tcp][stress]") {
  for (int n : {2, 5, 8}) {
    CAPTURE(n);
    CHECK(collx_test::stress<processes_tcp>(n, 150) == "");
  }
}

TEST_CASE("tcp::from_env reads the launchers' variables and asks for a rendezvous when it has none", "[tcp][env]") {
  // The variables of this test only, restored afterwards.
  const char* names[] = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT", "COLLX_STORE_PATH",
                         "RANK", "WORLD_SIZE", "COLLX_RANK", "COLLX_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                         "PMI_RANK", "PMI_SIZE", "COLLX_JOB"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  for (const char* n : names) {
    const char* v = std::getenv(n);
    saved.emplace_back(n, v ? std::optional<std::string>(v) : std::nullopt);
    unsetenv(n);
  }
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "1", 1);
  setenv("SLURM_JOB_ID", "4242", 1);
  try {
    collx::transport::tcp::from_env();
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::invalid_argument);
    CHECK_THAT(e.what(), Contains("srun") && Contains("MASTER_ADDR") && Contains("COLLX_STORE_PATH"));
  }
  {
    temp_dir d;
    setenv("COLLX_STORE_PATH", d.path.c_str(), 1);
    collx::communicator<collx::transport::tcp> comm{collx::transport::tcp::from_env()};
    CHECK(comm.size() == 1);
    std::vector<int> v{7};
    collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
    CHECK(v[0] == 7);
  }
  for (auto& [n, v] : saved) {
    if (v) setenv(n.c_str(), v->c_str(), 1);
    else unsetenv(n.c_str());
  }
}

TEST_CASE("over tcp: a split's member gone before the split's connections is named by its rank in the communicator split from",
          "[tcp][faults]") {
  // CI's chaos run (tcp) once killed a rank between a split's exchange of addresses and its
  // connections: the survivors' error named the split's "rank 0" alone, which no reader could
  // map to the job's rank 1 that died. Here the split's rank 0, rank 4 of the communicator split
  // from, offered a socket that is closed by the time rank 1 (its rank 7) connects.
  std::string dead;
  {
    auto [l, at] = net::listen_on(net::resolve("127.0.0.1", 0));
    dead = at.str();
  }
  auto [mine, at] = net::listen_on(net::resolve("127.0.0.1", 0));
  collx::transport::tcp_detail::rendezvous r("named.s1c0", 1, 2, collx::transport::tcp_config{}, net::fd{});
  std::string what;
  try {
    r.run_split(std::move(mine), {dead, at.str()}, "a-token", "a-session", false, net::clock::now() + 300ms, {4, 7});
  } catch (const collx::error& e) {
    what = e.what();
  }
  CHECK_THAT(what, Contains("rank 1 (rank 7 of the communicator split from) could not connect to rank 0 (rank 4 of the communicator split from)"));
  // Every try was refused (nothing listens there): the try the deadline cut short (a refused
  // connect says EINPROGRESS first, even on loopback) does not turn that into "timed out",
  // as it did in that run's message.
  CHECK_THAT(what, Contains("Connection refused"));
  CHECK_THAT(what, !Contains("timed out"));
}

namespace {
/// What a rank that fails sends its peers before it closes: an abort frame with its reason.
std::string abort_frame(const std::string& reason) {
  collx::transport::tcp_wire::msg_header h;
  h.kind = std::uint32_t(collx::transport::tcp_wire::msg_kind::abort);
  h.bytes = reason.size();
  return std::string(reinterpret_cast<const char*>(&h), sizeof h) + reason;
}
}  // namespace

TEST_CASE("over tcp: a split's member that dies before the split's connections fails its peers at once, not at the deadline",
          "[tcp][faults]") {
  // The chaos run (tcp, 180 s, after af9f747): job rank 2 killed 2 ms in, during the split; its
  // split's rank 0 waited for its hello until the rendezvous deadline (1 s there), joined the
  // survivors' shrink after theirs had ended, and was left out. A member's connection in the
  // communicator split from says at once that its process is gone (here: a socket pair's other
  // end, closed), whether this rank waits for its hello or to connect to it.
  //
  // And a member that failed, rather than died, is named with its reason: the abort frame it
  // sent on that connection before it closed. CI's chaos run (tcp, stop 31): job rank 4 killed
  // 4 ms in; rank 3 failed in the split's exchange of addresses for want of it, and left; its
  // split's other member, job rank 1, said only that rank 3 was gone, and no error named rank 4.
  for (const bool failed : {false, true})
  for (const bool below : {false, true}) {
    int sp[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0);
    net::fd mine_end(sp[0]);
    const std::string reason = "lost rank 9 of the job: its connection closed";
    if (failed) {
      const std::string frame = abort_frame(reason);
      REQUIRE(::write(sp[1], frame.data(), frame.size()) == ssize_t(frame.size()));
    }
    ::close(sp[1]);  // the member's process is gone, or it failed and left
    std::string dead;
    {
      auto [l, at] = net::listen_on(net::resolve("127.0.0.1", 0));
      dead = at.str();
    }
    auto [mine, at] = net::listen_on(net::resolve("127.0.0.1", 0));
    // below: this rank is the split's rank 1 and must connect to rank 0 (gone, its listener too);
    // else it is rank 0 and waits for rank 1's hello.
    const int me = below ? 1 : 0, other = 1 - me;
    std::vector<std::string> where(2);
    where[std::size_t(me)] = at.str();
    where[std::size_t(other)] = dead;
    std::vector<int> watch(2, -1);
    watch[std::size_t(other)] = mine_end.get();
    collx::transport::tcp_detail::rendezvous r("watched.s1c0", me, 2, collx::transport::tcp_config{}, net::fd{});
    std::string what;
    int code = 0;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      r.run_split(std::move(mine), where, "a-token", "a-session", false, net::clock::now() + 10s, below ? std::vector<int>{4, 7} : std::vector<int>{7, 4},
                  watch);
    } catch (const collx::error& e) {
      what = e.what();
      code = e.code().value();
    }
    const auto took = std::chrono::steady_clock::now() - t0;
    INFO(what);
    CHECK(code == int(collx::errc::peer_lost));
    CHECK_THAT(what, Contains("rank " + std::to_string(other) + " (rank 4 of the communicator split from) is gone"));
    CHECK_THAT(what, Contains(below ? "waited to connect to it" : "waited for its connection"));
    if (failed) CHECK_THAT(what, Contains("is gone while") && Contains(": it failed: " + reason));
    else CHECK_THAT(what, Contains("the process died"));
    CHECK(took < 3s);  // (the deadline: 10 s)
  }
}

TEST_CASE("over tcp: a split's member that fails and closes its connection before admitting this rank is named with its reason",
          "[tcp][faults]") {
  // The cascade the chaos run (tcp) found: a member of a split failed for want of a killed rank
  // and closed the connection a peer had just made to it; the peer's error said only that this
  // member "closed the connection before admitting" it. The member's reason comes on its
  // connection in the communicator split from: at once (its failure there aborted that
  // communicator), a moment later (it revokes that communicator in a shrink), or never.
  const std::string reason = "lost rank 9 of the job: its connection closed";
  for (const int late_ms : {0, 60, -1}) {
    int sp[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0);
    net::fd mine_end(sp[0]), member_end(sp[1]);
    auto lm = net::listen_on(net::resolve("127.0.0.1", 0));
    const net::fd& member = lm.first;
    const std::string member_at = lm.second.str();
    auto [mine, at] = net::listen_on(net::resolve("127.0.0.1", 0));
    // The split's rank 0 (rank 4 of the communicator split from): takes this rank's connection
    // and its hello, closes it, and says why in the communicator split from (late_ms -1: not).
    std::thread m([&, late_ms] {
      pollfd p{member.get(), POLLIN, 0};
      if (::poll(&p, 1, 5000) != 1) return;
      net::fd c(::accept(member.get(), nullptr, nullptr));
      collx::transport::tcp_wire::hello h;
      (void)net::read_exact(c.get(), &h, sizeof h, net::clock::now() + 5s);
      c.reset();
      if (late_ms < 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
      const std::string frame = abort_frame(reason);
      (void)!::write(member_end.get(), frame.data(), frame.size());
      member_end.reset();
    });
    collx::transport::tcp_detail::rendezvous r("failed.s1c0", 1, 2, collx::transport::tcp_config{}, net::fd{});
    std::string what;
    try {
      r.run_split(std::move(mine), {member_at, at.str()}, "a-token", "a-session", false, net::clock::now() + 10s, {4, 7},
                  {mine_end.get(), -1});
    } catch (const std::exception& e) {  // (any: the thread is joined whatever comes)
      what = e.what();
    }
    m.join();
    INFO(what);
    CHECK_THAT(what, Contains("rank 0 (rank 4 of the communicator split from)") && Contains("closed the connection"));
    if (late_ms >= 0) CHECK_THAT(what, Contains(": it failed: " + reason));
    else CHECK_THAT(what, !Contains("it failed"));
  }
}
