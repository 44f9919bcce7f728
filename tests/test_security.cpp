// Admission (docs/security.md): the job's secret is proven, never sent (a capture of a real job's
// loopback traffic holds no byte of it), a captured exchange replayed is refused, a stranger
// reads and writes nothing of a job's store though the job was given no secret, the secret is
// kept only where this user alone can read it, and a shared-memory segment another user made
// under the job's name is never joined.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>
#include <vector>

#include "scratch.hpp"

using namespace collx_test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
namespace net = collx::transport::net;
namespace wire = collx::transport::tcp_wire;
namespace auth = collx::transport::tcp_auth;
using collx::transport::tcp;
using collx::transport::tcp_config;

namespace {

std::string hex(const auth::mac& m) {
  std::string s;
  char b[3];
  for (std::byte x : m) {
    std::snprintf(b, sizeof b, "%02x", unsigned(x));
    s += b;
  }
  return s;
}

/// Every byte that crosses the loopback interface while alive, captured by a child process with
/// a raw packet socket (needs CAP_NET_RAW; usable() says whether it got one). A process, not a
/// thread: the test then forks its ranks, and a fork while another thread holds the allocator's
/// lock (ASan's) leaves the child stuck on it.
struct loopback_capture {
  pid_t child = -1;
  int stop_w = -1;
  std::string file = "/tmp/collx-capture-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++);
  bool ok = false;
  std::string bytes;
  static int& counter() {
    static int n = 0;
    return n;
  }
  loopback_capture() {
    int ready[2], stop[2];
    if (::pipe(ready) != 0 || ::pipe(stop) != 0) return;
    child = ::fork();
    if (child == 0) {
      ::close(ready[0]);
      ::close(stop[1]);
      const int fd = ::socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
      sockaddr_ll a{};
      a.sll_family = AF_PACKET;
      a.sll_protocol = htons(ETH_P_ALL);
      a.sll_ifindex = int(if_nametoindex("lo"));
      const bool up = fd >= 0 && a.sll_ifindex != 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      (void)!::write(ready[1], up ? "1" : "0", 1);
      if (!up) ::_exit(0);
      const int out = ::open(file.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
      static char b[1 << 16];
      for (bool stopping = false;;) {
        pollfd p[2] = {{fd, POLLIN, 0}, {stop[0], POLLIN, 0}};
        ::poll(p, 2, stopping ? 0 : 20);
        const ssize_t k = ::recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (k > 0) {
          (void)!::write(out, b, std::size_t(k));
          continue;
        }
        if (stopping) break;  // (what was queued is taken)
        stopping = p[1].revents != 0;
      }
      ::_exit(0);
    }
    ::close(ready[1]);
    ::close(stop[0]);
    stop_w = stop[1];
    char c = '0';
    ok = child > 0 && ::read(ready[0], &c, 1) == 1 && c == '1';
    ::close(ready[0]);
  }
  bool usable() const { return ok; }
  std::string finish() {
    if (child > 0) {
      ::close(stop_w);
      int st = 0;
      ::waitpid(child, &st, 0);
      child = -1;
      std::ifstream i(file, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(i), {});
      std::remove(file.c_str());
    }
    return bytes;
  }
  ~loopback_capture() { finish(); }
};

/// Ranks 0..n-1 of job `job` as threads of this process, rank 0 serving the TCP store on a
/// listener of 127.0.0.1 (or `at`) made here; body(comm) on each. Each rank's error ("" if none).
template <class Body, class Gate = void (*)(int)>
std::vector<std::string> run_tcp_threads(int n, const std::string& job, tcp_config cfg, const net::address& at, net::fd& listener,
                                         Body body, Gate gate = [](int) {}) {
  std::vector<std::string> err(static_cast<std::size_t>(n));
  std::vector<std::thread> ts;
  cfg.master_port = at.port();
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        tcp_config c = cfg;
        if (r == 0) c.serve_store_fd = ::dup(listener.get());
        gate(r);
        collx::options o;
        o.timeout = 20s;
        collx::communicator<tcp> comm{tcp(job, r, n, c), o};
        body(comm);
      } catch (const std::exception& e) {
        err[std::size_t(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return err;
}

/// The reply's status to `bytes` sent on a new connection to a store at `at` (-1: dropped).
int store_reply(const net::address& at, const std::string& bytes) {
  std::string why;
  const auto dl = net::clock::now() + 10s;
  net::fd s = net::connect_until(at, dl, why);
  REQUIRE(s);
  REQUIRE(net::write_all(s.get(), bytes.data(), bytes.size(), dl) == net::io::ok);
  wire::store_rep_header h;
  if (net::read_exact(s.get(), &h, sizeof h, dl) != net::io::ok) return -1;
  return int(h.status);
}

/// Files left in `dir` whose names start with "tcp-".
int secret_files_left(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) n += e.path().filename().string().rfind("tcp-", 0) == 0;
  return n;
}

}  // namespace

TEST_CASE("security: the MAC is HMAC-SHA-256 as RFC 4231 gives it, over length-framed parts", "[security]") {
  // RFC 4231, test case 2
  CHECK(hex(auth::hmac_sha256("Jefe", {"what do ya want ", "for nothing?"})) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // compute() frames each part with its length: the same bytes split differently differ
  std::string framed;
  for (std::string_view p : {"ab", "c"}) {
    std::uint64_t n = p.size();
    for (int i = 0; i < 8; ++i, n >>= 8) framed += char(n & 0xff);
    framed += p;
  }
  CHECK(auth::compute("k", {"ab", "c"}) == auth::hmac_sha256("k", {std::string_view(framed)}));
  CHECK(auth::compute("k", {"ab", "c"}) != auth::compute("k", {"a", "bc"}));
  CHECK(auth::compute("k", {"ab"}) != auth::compute("k2", {"ab"}));
}

TEST_CASE("security: a stranger reads and writes nothing of a job's store, though the job was given no secret", "[security][tcp]") {
  // Before: with no COLLX_JOB_TOKEN the store checked nothing, and rank 0 wrote the token into it.
  temp_dir mine;  // this test's private directory (others running at once use their own)
  scoped_env private_dir("COLLX_PRIVATE_DIR", mine.path);
  auto listening = net::listen_on(net::resolve("127.0.0.1", 0));
  net::fd& l = listening.first;
  const net::address at = listening.second;
  tcp_config cfg;
  cfg.token.clear();
  cfg.token_file.clear();
  cfg.master_addr = "127.0.0.1";
  std::atomic<bool> asked_all{false};
  std::vector<int> asked;
  // Rank 0 serves its store and waits in its rendezvous; the stranger asks; then the others come.
  std::thread stranger([&] {
    asked.push_back(store_reply(at, wire::encode_store_request(wire::store_op::get, "anon/addr/0", "")));
    asked.push_back(store_reply(at, wire::encode_store_request(wire::store_op::set, "anon/addr/1", "10.9.9.9:1 x 0,")));
    asked.push_back(store_reply(at, wire::encode_store_request(wire::store_op::add, "anon/ready", std::string(8, '\0'))));
    asked_all.store(true);
  });
  const auto err = run_tcp_threads(
      3, "anon", cfg, at, l,
      [&](auto& comm) {
        std::vector<int> v(17, comm.rank() + 1);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
        CHECK(v == std::vector<int>(17, 6));
      },
      [&](int r) {
        while (r != 0 && !asked_all.load()) std::this_thread::sleep_for(1ms);
      });
  stranger.join();
  for (const auto& e : err) CHECK(e == "");
  CHECK(asked == std::vector<int>{1, 1, 1});  // denied, each
  CHECK(secret_files_left(mine.path) == 0);   // rank 0's file for the others went with its rendezvous
}

TEST_CASE("security: the job's secret never crosses the wire", "[security][tcp]") {
  loopback_capture cap;
  if (!cap.usable()) {
    WARN("skipped: no raw packet socket on the loopback interface (needs CAP_NET_RAW)");
    return;
  }
  const std::string secret = "s3cr3t-" + collx::transport::tcp_detail::random_secret().substr(0, 40);
  tcp_config cfg;
  cfg.token = secret;
  // Real processes; rank 0 serves the TCP store, the others log into it, then every pair admits
  // each other; then a few collectives.
  collx::launch_processes(
      3,
      [](auto& comm) {
        std::vector<float> v(1000, float(comm.rank()));
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
        if (v[999] != 3.0f) throw std::runtime_error("wrong sum");
        collx::barrier(comm);
      },
      collx::options{}, cfg);
  const std::string seen = cap.finish();
  const auto magic = [](std::uint32_t m) { return std::string(reinterpret_cast<const char*>(&m), 4); };
  // the capture saw the admission and the store's login...
  CHECK(seen.find(magic(wire::kHelloMagic)) != std::string::npos);
  CHECK(seen.find(magic(wire::kProofMagic)) != std::string::npos);
  CHECK(seen.find(magic(wire::kStoreReqMagic)) != std::string::npos);
  // ...and no piece of the secret
  CHECK(seen.find(secret) == std::string::npos);
  CHECK(seen.find(secret.substr(0, 12)) == std::string::npos);
  CHECK(seen.find(secret.substr(secret.size() - 12)) == std::string::npos);
}

TEST_CASE("security: a captured admission replayed to a rank is refused", "[security][tcp]") {
  // Before: the hello carried the token, so its bytes admitted whoever sent them again.
  temp_dir d;
  stderr_capture log;
  tcp_config cfg;
  cfg.store_path = d.path;
  cfg.token = "replay-secret";
  cfg.rendezvous_timeout = 20s;
  auto rank0 = [&](std::string& err, std::chrono::seconds within) {
    try {
      tcp_config c = cfg;
      c.rendezvous_timeout = within;
      tcp t("replayed", 0, 2, c);
    } catch (const std::exception& e) {
      err = e.what();
    }
  };
  std::string first_at;  // rank 0's address in the first run (the second run's replaces it)
  auto connect0 = [&] {
    collx::transport::file_store st(d.path);
    std::optional<std::string> v;
    const auto until = net::clock::now() + 10s;
    while ((!v || *v == first_at) && net::clock::now() < until) {
      v = st.get("replayed/addr/0", until);
      if (v && *v == first_at) std::this_thread::sleep_for(2ms);
    }
    REQUIRE(v);
    if (first_at.empty()) first_at = *v;
    std::string why;
    net::fd s = net::connect_until(net::parse_host_port(v->substr(0, v->find(' '))), net::clock::now() + 10s, why);
    REQUIRE(s);
    return s;
  };
  // A real admission of rank 1 by rank 0, every byte rank 1 sent recorded (as on the wire).
  std::string recorded;
  {
    std::string err;  // (it times out waiting for the rest of rank 1's rendezvous: 2 s)
    std::thread r0(rank0, std::ref(err), 2s);
    {
      net::fd s = connect0();
      wire::hello h;
      h.rank = 1;
      h.size = 2;
      const auto nc = auth::fresh_nonce();
      std::memcpy(h.nonce, nc.data(), nc.size());
      const auto dl = net::clock::now() + 10s;
      REQUIRE(net::write_all(s.get(), &h, sizeof h, dl) == net::io::ok);
      wire::challenge c;
      REQUIRE(net::read_exact(s.get(), &c, sizeof c, dl) == net::io::ok);
      REQUIRE(c.magic == wire::kChallengeMagic);
      auth::nonce na;
      std::memcpy(na.data(), c.nonce, na.size());
      const std::string ctx = collx::transport::tcp_detail::rendezvous::context("replayed", 1, 0, 2);
      const std::span<const std::byte> hb(reinterpret_cast<const std::byte*>(&h), sizeof h);
      CHECK(auth::same({c.mac, wire::kMac}, auth::accept_proof(cfg.token, ctx, hb, na)));  // rank 0 proved itself
      wire::proof p;
      const auto m = auth::connect_proof(cfg.token, ctx, hb, na);
      std::memcpy(p.mac, m.data(), m.size());
      REQUIRE(net::write_all(s.get(), &p, sizeof p, dl) == net::io::ok);
      wire::verdict v;
      REQUIRE(net::read_exact(s.get(), &v, sizeof v, dl) == net::io::ok);
      CHECK(v.code == 0);  // admitted
      recorded.append(reinterpret_cast<const char*>(&h), sizeof h);
      recorded.append(reinterpret_cast<const char*>(&p), sizeof p);
    }
    r0.join();
  }
  // The same job again; the recorded bytes, replayed to its rank 0, are refused; then the real
  // rank 1 is admitted.
  std::string err0, err1;
  std::thread r0(rank0, std::ref(err0), 20s);
  {
    net::fd s = connect0();
    const auto dl = net::clock::now() + 10s;
    REQUIRE(net::write_all(s.get(), recorded.data(), recorded.size(), dl) == net::io::ok);
    wire::challenge c;
    REQUIRE(net::read_exact(s.get(), &c, sizeof c, dl) == net::io::ok);
    wire::verdict v;
    REQUIRE(net::read_exact(s.get(), &v, sizeof v, dl) == net::io::ok);
    CHECK(v.code == std::uint32_t(wire::verdict_code::bad_token));
  }
  std::thread r1([&] {
    try {
      tcp t("replayed", 1, 2, cfg);
    } catch (const std::exception& e) {
      err1 = e.what();
    }
  });
  r0.join();
  r1.join();
  CHECK(err0 == "");
  CHECK(err1 == "");
  CHECK_THAT(log.text(), Contains("could not prove it holds the job's secret"));
}

TEST_CASE("security: the secret is kept only where this user alone can read it", "[security][tcp]") {
  temp_dir d;
  const std::string file = d.path + "/secret";
  {
    std::ofstream o(file);
    o << "from-a-file\n";
  }
  auto job = [&](tcp_config cfg) -> std::string {  // 2 ranks as threads, a file store: rank 0's error
    temp_dir store;
    cfg.store_path = store.path;
    cfg.token.clear();
    std::string err[2];
    std::thread r1([&] {
      try {
        tcp t("private", 1, 2, cfg);
      } catch (const std::exception& e) {
        err[1] = e.what();
      }
    });
    try {
      tcp t("private", 0, 2, cfg);
    } catch (const std::exception& e) {
      err[0] = e.what();
    }
    r1.join();
    return err[0].empty() ? err[1] : err[0];
  };
  SECTION("COLLX_JOB_TOKEN_FILE") {
    tcp_config cfg;
    cfg.rendezvous_timeout = 3s;
    cfg.token_file = file;
    ::chmod(file.c_str(), 0644);
    CHECK_THAT(job(cfg), Contains("has mode 0644") && Contains(file));
    ::chmod(file.c_str(), 0600);
    CHECK(job(cfg) == "");
    const std::string link = d.path + "/link";
    REQUIRE(::symlink(file.c_str(), link.c_str()) == 0);
    cfg.token_file = link;
    CHECK_THAT(job(cfg), Contains("a link is not followed"));
  }
  SECTION("a file store's directory") {
    temp_dir open_dir;
    ::chmod(open_dir.path.c_str(), 0755);
    CHECK_THROWS_WITH(collx::transport::file_store(open_dir.path), Contains("has mode 0755") && Contains(open_dir.path));
    // a link planted under a key's name is never read through, and a write replaces the link
    temp_dir dir;
    collx::transport::file_store st(dir.path);
    st.set("k1", "v1");
    std::string name;
    for (const auto& e : std::filesystem::directory_iterator(dir.path)) name = e.path().string();
    REQUIRE(!name.empty());
    const std::string outside = d.path + "/outside";
    {
      std::ofstream o(outside);
      o << "not the store's";
    }
    std::filesystem::remove(name);
    REQUIRE(::symlink(outside.c_str(), name.c_str()) == 0);
    CHECK_THROWS_WITH(st.get("k1", net::clock::now()), Contains("is a link"));
    st.set("k1", "v2");
    CHECK(st.get("k1", net::clock::now()) == std::optional<std::string>("v2"));
    std::ifstream i(outside);
    CHECK(std::string(std::istreambuf_iterator<char>(i), {}) == "not the store's");
    struct stat s {};
    REQUIRE(::stat(name.c_str(), &s) == 0);
    CHECK((s.st_mode & 0777) == 0600);
  }
  SECTION("this user's private directory, made by another user first") {
    if (::geteuid() != 0) {
      WARN("skipped: becoming another user's directory needs root");
      return;
    }
    temp_dir other;
    REQUIRE(::chown(other.path.c_str(), 65534, 65534) == 0);
    scoped_env v("COLLX_PRIVATE_DIR", other.path);
    auto listening = net::listen_on(net::resolve("127.0.0.1", 0));
    tcp_config cfg;
    cfg.token.clear();
    cfg.token_file.clear();
    cfg.master_addr = "127.0.0.1";
    cfg.rendezvous_timeout = 3s;
    const auto err = run_tcp_threads(2, "squatted", cfg, listening.second, listening.first, [](auto&) {});
    CHECK_THAT(err[0], Contains("belongs to uid 65534") && Contains(other.path));
  }
}

TEST_CASE("security: a job across hosts with no secret says so once - COLLX_REQUIRE_SECRET=1 refuses it and so does TLS", "[security][tcp]") {
  // A non-loopback address of this host stands for a network address: nothing says all ranks
  // run here.
  std::string ip;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr && ip.empty(); i = i->ifa_next)
      if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK)) {
        char b[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, b, sizeof b);
        ip = b;
      }
    ::freeifaddrs(ifs);
  }
  if (ip.empty()) {
    WARN("skipped: this host has no network address besides loopback");
    return;
  }
  tcp_config cfg;
  cfg.token.clear();
  cfg.token_file.clear();
  cfg.master_addr = ip;
  cfg.rendezvous_timeout = 10s;
  {
    stderr_capture log;
    auto listening = net::listen_on(net::resolve(ip, 0));
    const auto err = run_tcp_threads(3, "open", cfg, listening.second, listening.first, [](auto& comm) { collx::barrier(comm); });
    for (const auto& e : err) CHECK(e == "");
    const std::string t = log.text();
    CHECK_THAT(t, Contains("runs across hosts without a secret") && Contains("COLLX_JOB_TOKEN"));
    CHECK(t.find("without a secret") == t.rfind("without a secret"));  // once: rank 0
  }
  {
    scoped_env v("COLLX_REQUIRE_SECRET", "1");
    auto listening = net::listen_on(net::resolve(ip, 0));
    const auto err = run_tcp_threads(2, "refused", cfg, listening.second, listening.first, [](auto&) {});
    CHECK_THAT(err[0], Contains("without a secret") && Contains("COLLX_REQUIRE_SECRET=1"));
  }
  {  // TLS keys its channels with the secret: none, no TLS
    tcp_config c = cfg;
    c.tls = true;
    stderr_capture quiet;
    auto listening = net::listen_on(net::resolve(ip, 0));
    const auto err = run_tcp_threads(2, "tls-open", c, listening.second, listening.first, [](auto&) {});
    CHECK_THAT(err[0], Contains("COLLX_TCP_TLS=1") && Contains("has none"));
  }
}

namespace {
/// Runs an n-rank shm job named `job` as threads of this process: each rank's error ("" if none),
/// and how long the slowest took.
std::vector<std::string> run_shm_threads(int n, const std::string& job, std::chrono::milliseconds& took) {
  std::vector<std::string> err(static_cast<std::size_t>(n));
  std::vector<std::thread> ts;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        collx::transport::shm::config cfg;
        cfg.attach_timeout = 30s;
        collx::communicator comm{collx::transport::shm(job, r, n, cfg)};
        std::vector<int> v(8, r);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
      } catch (const std::exception& e) {
        err[std::size_t(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  return err;
}

/// Creates shared-memory segment `name` (mode `mode`, 4 KiB, "squatted" written at its start)
/// as user `uid`, in a child process.
void squat(const std::string& name, uid_t uid, mode_t mode) {
  const pid_t c = ::fork();
  REQUIRE(c >= 0);
  if (c == 0) {
    if (uid != ::geteuid() && ::setuid(uid) != 0) ::_exit(2);
    const int f = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, mode);
    if (f < 0 || ::fchmod(f, mode) != 0 || ::ftruncate(f, 4096) != 0 || ::write(f, "squatted", 8) != 8) ::_exit(3);
    ::_exit(0);
  }
  int st = 0;
  ::waitpid(c, &st, 0);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
}

std::string segment_start(const std::string& name) {
  const int f = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (f < 0) return "(gone)";
  char b[8] = {};
  const ssize_t k = ::read(f, b, sizeof b);
  ::close(f);
  return std::string(b, std::size_t(k > 0 ? k : 0));
}
}  // namespace

TEST_CASE("security: a segment another user made under the job's name is never joined", "[security][shm]") {
  if (::geteuid() != 0) {
    WARN("skipped: playing another user needs root");
    return;
  }
  const std::string job = "squat-" + std::to_string(::getpid());
  const std::string name = collx::transport::shm::segment_name(job);
  CHECK_THAT(name, Contains("/collx-" + std::to_string(::geteuid()) + "-"));  // the user's id is in the name
  SECTION("made open to all by another user: every rank fails at once, naming it") {
    // Before: the ranks that came first joined it; rank 0 failed with "File exists".
    squat(name, 65534, 0666);
    std::chrono::milliseconds took{};
    const auto err = run_shm_threads(3, job, took);
    for (const auto& e : err) CHECK_THAT(e, Contains("belongs to uid 65534") && Contains(name) && Contains("mode 0666"));
    CHECK(took < 2s);
    CHECK(segment_start(name) == "squatted");  // nothing of the job written into it
    ::shm_unlink(name.c_str());
  }
  SECTION("closed to this user: a rank that cannot open it says whose it is") {
    // root squats a name, a job of uid 65534 meets it
    const pid_t c = ::fork();
    REQUIRE(c >= 0);
    if (c == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
      const std::string mine = collx::transport::shm::segment_name(job);
      // the parent squats this name before the job starts: wait for it
      for (int i = 0; i < 2000 && ::access(("/dev/shm" + mine).c_str(), F_OK) != 0; ++i) ::usleep(1000);
      std::chrono::milliseconds took{};
      const auto err = run_shm_threads(2, job, took);
      bool ok = took < 2s;
      for (const auto& e : err) ok = ok && e.find("belongs to uid 0") != std::string::npos;
      ::_exit(ok ? 0 : 1);
    }
    const std::string theirs = "/collx-65534-" + job;
    squat(theirs, 0, 0600);
    int st = 0;
    ::waitpid(c, &st, 0);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
    CHECK(segment_start(theirs) == "squatted");
    ::shm_unlink(theirs.c_str());
  }
}

TEST_CASE("security: a flood of strangers on the store does not keep a rank out", "[security][tcp]") {
  // Before: the store served 1,024 clients at most and dropped one only after 10 s of silence,
  // which any byte restarted: 1,024 strangers sending a byte now and then kept every rank out.
  constexpr int kStrangers = 1024;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < 4 * kStrangers && lim.rlim_max >= 4 * kStrangers) {
    lim.rlim_cur = 4 * kStrangers;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < 4 * kStrangers) {
    WARN("skipped: fewer than " << 4 * kStrangers << " descriptors to be had");
    return;
  }
  stderr_capture log;
  auto listening = net::listen_on(net::resolve("127.0.0.1", 0));
  const net::address at = listening.second;
  int go[2], ready[2], stop[2];
  REQUIRE(::pipe(go) == 0);
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(stop) == 0);
  const pid_t flood = ::fork();  // (before any thread: the child allocates nothing)
  REQUIRE(flood >= 0);
  if (flood == 0) {  // the strangers: once the store serves, 1,024 connections, a byte each every 500 ms
    ::close(go[1]);
    ::close(ready[0]);
    ::close(stop[1]);
    char g = 0;
    if (::read(go[0], &g, 1) != 1) ::_exit(2);
    static int fds[kStrangers];
    for (int i = 0; i < kStrangers; ++i) {
      fds[i] = ::socket(at.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fds[i] < 0 || ::connect(fds[i], at.sa(), at.len) != 0) ::_exit(3);
      (void)!::send(fds[i], "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (::write(ready[1], "R", 1) != 1) ::_exit(4);
    for (;;) {
      pollfd p{stop[0], POLLIN, 0};
      if (::poll(&p, 1, 500) != 0) ::_exit(0);
      for (int f : fds) (void)!::send(f, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }
  ::close(go[0]);
  ::close(ready[1]);
  ::close(stop[0]);
  tcp_config cfg;
  cfg.token.clear();
  cfg.token_file.clear();
  cfg.master_addr = "127.0.0.1";
  cfg.rendezvous_timeout = 20s;
  std::chrono::steady_clock::time_point rank1_starts{};
  double rank1_s = -1;  // from rank 1's start to its communicator
  bool flooded = false;
  const auto err = run_tcp_threads(
      2, "flooded", cfg, at, listening.first,
      [&](auto& comm) {
        if (comm.rank() == 1) rank1_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - rank1_starts).count();
        std::vector<int> v(5, comm.rank() + 1);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
        CHECK(v == std::vector<int>(5, 3));
      },
      [&](int r) {
        if (r == 0) {
          (void)!::write(go[1], "G", 1);  // rank 0's store serves in a moment: the flood comes
          return;
        }
        char c = 0;
        flooded = ::read(ready[0], &c, 1) == 1;
        std::this_thread::sleep_for(300ms);  // and has sent its bytes
        rank1_starts = std::chrono::steady_clock::now();
      });
  ::close(stop[1]);
  ::close(go[1]);
  int st = 0;
  ::waitpid(flood, &st, 0);
  CHECK(flooded);
  for (const auto& e : err) CHECK(e == "");
  CAPTURE(rank1_s);
  CHECK(rank1_s >= 0);
  CHECK(rank1_s < 1.0);
  CHECK_THAT(log.text(), Contains("collx tcp store: refused") && Contains("not proven themselves"));
}

TEST_CASE("security: a rank's rendezvous port flooded by strangers", "[security][tcp]") {
  // Rank 0 waits in its rendezvous while strangers connect to its port: 60 that send what looks
  // like a shrink's hello or a position query without the MAC, 1,000 that say nothing; then two
  // real shrink hellos and a real query (a peer already past its rendezvous). Rank 1 still gets
  // in, and the real three are set aside for the communicator's listener. Before: whatever began
  // with either magic was set aside unchecked, the 4n + 16 places filled with the forgeries, and
  // the real hellos were refused as strangers (a peer's shrink failed for it).
  namespace td = collx::transport::tcp_detail;
  constexpr int kForged = 60, kSilent = 1000;  // (1,060 strangers)
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < 4096 && lim.rlim_max >= 4096) {
    lim.rlim_cur = 4096;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < 4096) {
    WARN("skipped: fewer than 4096 descriptors to be had");
    return;
  }
  stderr_capture log;
  const std::string job = "flood.r", session = "s-" + td::random_secret().substr(0, 8), secret = td::random_secret();
  const std::string proven = job + "#" + session;
  auto listen0 = net::listen_on(net::resolve("127.0.0.1", 0), 1024);
  auto listen1 = net::listen_on(net::resolve("127.0.0.1", 0), 1024);
  const net::address at0 = listen0.second, at1 = listen1.second;
  const std::vector<std::string> where{at0.str(), at1.str()};
  td::rendezvous r0(job, 0, 2, tcp_config{}, net::fd{}), r1(job, 1, 2, tcp_config{}, net::fd{});
  std::string err0, err1;
  std::thread rank0([&, l = std::move(listen0.first)]() mutable {
    try {
      r0.run_split(std::move(l), where, secret, session, false, net::clock::now() + 30s);
    } catch (const std::exception& e) {
      err0 = e.what();
    }
  });
  auto dial = [&] {
    const int f = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(f >= 0);
    REQUIRE(::connect(f, at0.sa(), at0.len) == 0);
    return net::fd(f);
  };
  std::vector<net::fd> strangers;
  // (10 forgeries, the silent ones, then 50 forgeries: the log, which names only the first 32
  // refusals, shows both kinds)
  for (int i = 0; i < kForged; ++i) {  // right magic and version, no proof (a MAC of zeros, or of another secret)
    if (i == 10)
      for (int k = 0; k < kSilent; ++k) strangers.push_back(dial());
    net::fd f = dial();
    if (i % 2 == 0) {
      wire::shrink_hello h;
      h.rank = 1;
      h.size = 2;
      if (i % 4 == 0) {
        const auto m = td::shrink_mac("not-the-secret", proven, h, 0);
        std::memcpy(h.mac, m.data(), m.size());
      }
      REQUIRE(::send(f.get(), &h, sizeof h, MSG_NOSIGNAL) == ssize_t(sizeof h));
    } else {
      wire::position_query q;
      q.rank = 1;
      q.size = 2;
      q.job = collx::detail::fnv1a(job);
      REQUIRE(::send(f.get(), &q, sizeof q, MSG_NOSIGNAL) == ssize_t(sizeof q));
    }
    strangers.push_back(std::move(f));
  }
  std::vector<net::fd> real;
  for (int i = 0; i < 2; ++i) {
    wire::shrink_hello h;
    h.rank = 1;
    h.size = 2;
    h.epoch = std::uint32_t(i + 1);
    const auto m = td::shrink_mac(secret, proven, h, 0);
    std::memcpy(h.mac, m.data(), m.size());
    real.push_back(dial());
    REQUIRE(::send(real.back().get(), &h, sizeof h, MSG_NOSIGNAL) == ssize_t(sizeof h));
  }
  {
    wire::position_query q;
    q.rank = 1;
    q.size = 2;
    q.job = collx::detail::fnv1a(job);
    const auto m = td::query_mac(secret, proven, q, 0);
    std::memcpy(q.mac, m.data(), m.size());
    real.push_back(dial());
    REQUIRE(::send(real.back().get(), &q, sizeof q, MSG_NOSIGNAL) == ssize_t(sizeof q));
  }
  std::this_thread::sleep_for(500ms);  // rank 0 has looked at them
  const auto t0 = std::chrono::steady_clock::now();
  try {
    r1.run_split(std::move(listen1.first), where, secret, session, false, net::clock::now() + 30s);
  } catch (const std::exception& e) {
    err1 = e.what();
  }
  rank0.join();
  const double rank1_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(err0 == "");
  CHECK(err1 == "");
  CAPTURE(rank1_s);
  CHECK(rank1_s < 1.0);  // (strangers are dropped 5 s after they came: rank 1 did not wait them out)
  // What rank 0 set aside: the three real ones, each whole; no forgery; the rest silent.
  int shrinks = 0, queries = 0, silent = 0, other = 0;
  for (net::fd& f : r0.early()) {
    switch (td::peek_opening(f.get(), secret, proven, 0, 2, collx::detail::fnv1a(job)).what) {
      case td::opening::shrink: ++shrinks; break;
      case td::opening::query: ++queries; break;
      case td::opening::pending: ++silent; break;
      default: ++other; break;
    }
  }
  CHECK(shrinks == 2);
  CHECK(queries == 1);
  CHECK(other == 0);
  CHECK(r0.early().size() <= std::size_t(4 * 2 + 16));
  CHECK_THAT(log.text(), Contains("without proof that its sender holds the job's secret") && Contains("not proven themselves"));
}

TEST_CASE("security: with TLS a byte changed on the wire fails the call, naming the peer - without TLS it goes unseen",
          "[security][tcp][tls]") {
  // A relay between rank 1 and rank 0 (rank 0's published address rewritten to the relay's in the
  // job's store) flips one bit of what rank 1 sends, 200,000 bytes in. Plain TCP has no check:
  // rank 0's sum comes out wrong (the control). With TLS every record is authenticated: the call
  // fails on rank 0, naming rank 1, and no rank returns a wrong sum.
  constexpr std::size_t kFlipAt = 200000;
  auto run = [&](bool tls) {
    temp_dir d;
    tcp_config cfg;
    cfg.store_path = d.path;
    cfg.token = "tamper-" + collx::transport::tcp_detail::random_secret().substr(0, 32);
    cfg.tls = tls;
    cfg.rendezvous_timeout = 20s;
    auto [relay_l, relay_at] = net::listen_on(net::resolve("127.0.0.1", 0));
    std::atomic<bool> stop{false};
    std::atomic<bool> flipped{false};
    std::string err[2];
    bool wrong[2] = {false, false};
    auto body = [&](int r) {
      try {
        tcp_config c = cfg;
        collx::options o;
        o.timeout = 10s;
        collx::communicator<tcp> comm{tcp("tamper", r, 2, c), o};
        std::vector<std::int64_t> x(262147, r + 1);  // (a prime count: 2 MiB, a megabyte each way)
        for (int k = 0; k < 3; ++k) {
          std::fill(x.begin(), x.end(), std::int64_t(r + 1));
          collx::all_reduce(comm, std::span{x}, collx::ops::sum{});
          for (std::int64_t e : x) wrong[r] = wrong[r] || e != 3;
        }
      } catch (const std::exception& e) {
        err[r] = e.what();
      }
    };
    std::thread rank0(body, 0);
    // Rank 0's address, once published, becomes the relay's; the relay dials the real one.
    collx::transport::file_store st(d.path, net::clock::now() + 20s);
    const auto published = st.get("tamper/addr/0", net::clock::now() + 20s);
    REQUIRE(published);
    const std::string real_at = published->substr(0, published->find(' '));
    st.set("tamper/addr/0", relay_at.str() + published->substr(published->find(' ')));
    std::thread relay([&, l = relay_l.get()] {
      net::fd in;
      for (int i = 0; i < 2000 && !in && !stop; ++i) {
        const int f = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
        if (f >= 0) in = net::fd(f);
        else std::this_thread::sleep_for(5ms);
      }
      if (!in) return;
      std::string why;
      net::fd out = net::connect_until(net::parse_host_port(real_at), net::clock::now() + 5s, why);
      if (!out) return;
      std::size_t up = 0;  // bytes relayed from rank 1 to rank 0
      char b[4096];
      while (!stop) {
        pollfd p[2] = {{in.get(), POLLIN, 0}, {out.get(), POLLIN, 0}};
        if (::poll(p, 2, 50) <= 0) continue;
        for (int side = 0; side < 2; ++side) {
          if (p[side].revents == 0) continue;
          const int from = side == 0 ? in.get() : out.get(), to = side == 0 ? out.get() : in.get();
          const ssize_t k = ::recv(from, b, sizeof b, MSG_DONTWAIT);
          if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return;  // (closing both ends)
          if (k < 0) continue;
          if (side == 0 && up <= kFlipAt && kFlipAt < up + std::size_t(k)) {
            b[kFlipAt - up] ^= 0x10;
            flipped = true;
          }
          if (side == 0) up += std::size_t(k);
          if (net::write_all(to, b, std::size_t(k), net::clock::now() + 10s) != net::io::ok) return;
        }
      }
    });
    std::thread rank1(body, 1);
    rank1.join();
    rank0.join();
    stop = true;
    relay.join();
    CHECK(flipped);
    struct result {
      std::string err0, err1;
      bool wrong0, wrong1;
    };
    return result{err[0], err[1], wrong[0], wrong[1]};
  };
  const auto plain = run(false);
  CHECK(plain.err0 == "");
  CHECK(plain.err1 == "");
  CHECK((plain.wrong0 || plain.wrong1));  // the flipped bit went unseen into a sum
  const auto tls = run(true);
  INFO(tls.err0);
  INFO(tls.err1);
  CHECK(!tls.wrong0);
  CHECK(!tls.wrong1);
  CHECK_THAT(tls.err0, Contains("rank 1") && Contains("does not authenticate"));
  CHECK(tls.err1 != "");
}

TEST_CASE("security: with TLS the data crosses the wire encrypted, and every collective is right", "[security][tcp][tls]") {
  loopback_capture probe;
  if (!probe.usable()) {
    WARN("skipped: no raw packet socket on the loopback interface (needs CAP_NET_RAW)");
    return;
  }
  probe.finish();
  const std::string canary = "collx-plaintext-canary-" + collx::transport::tcp_detail::random_secret().substr(0, 24);
  auto run = [&](bool tls) {  // 3 processes: a broadcast of the canary, an all_reduce; the capture
    loopback_capture cap;
    tcp_config cfg;
    cfg.token = "tls-secret-" + collx::transport::tcp_detail::random_secret().substr(0, 32);
    cfg.tls = tls;
    collx::launch_processes(
        3,
        [&](auto& comm) {
          std::string b = comm.rank() == 0 ? canary : std::string(canary.size(), '?');
          std::vector<char> v(b.begin(), b.end());
          collx::broadcast(comm, std::span{v}, 0);
          if (std::string(v.begin(), v.end()) != canary) throw std::runtime_error("the broadcast differs");
          std::vector<std::int64_t> x(100003, comm.rank() + 1);  // (a large prime: many TLS records)
          collx::all_reduce(comm, std::span{x}, collx::ops::sum{});
          for (std::int64_t e : x)
            if (e != 6) throw std::runtime_error("the all_reduce is wrong");
        },
        collx::options{}, cfg);
    return cap.finish();
  };
  CHECK(run(false).find(canary) != std::string::npos);  // plain: the capture does see the data
  CHECK(run(true).find(canary) == std::string::npos);   // TLS: it does not
}

TEST_CASE("security: a rank with TLS and one without do not make a job, and say why", "[security][tcp][tls]") {
  temp_dir d;
  tcp_config cfg;
  cfg.store_path = d.path;
  cfg.token = "tls-mismatch";
  cfg.rendezvous_timeout = 3s;
  std::string err[2];
  std::thread r1([&] {
    tcp_config c = cfg;
    c.tls = false;
    try {
      collx::communicator<tcp> comm{tcp("mixed", 1, 2, c)};
      std::vector<int> v(3, 1);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
    } catch (const std::exception& e) {
      err[1] = e.what();
    }
  });
  try {
    tcp_config c = cfg;
    c.tls = true;
    tcp t("mixed", 0, 2, c);
  } catch (const std::exception& e) {
    err[0] = e.what();
  }
  r1.join();
  CHECK_THAT(err[0], Contains("TLS handshake") && Contains("rank 1") && Contains("COLLX_TCP_TLS"));
  CHECK(err[1] != "");
}

TEST_CASE("security: a shrink's hello answered by a process without the secret is not taken for the rank", "[security][tcp]") {
  // Before: whoever held a dead rank's address could answer "admitted" and become that rank of
  // the shrunk communicator. Rank 1's address here is a stranger's listener that does so.
  auto [mine, mine_at] = net::listen_on(net::resolve("127.0.0.1", 0));
  auto [theirs, theirs_at] = net::listen_on(net::resolve("127.0.0.1", 0));
  std::thread stranger([&, l = theirs.get()] {
    for (int i = 0; i < 500; ++i) {
      const int f = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
      if (f < 0) {
        std::this_thread::sleep_for(10ms);
        continue;
      }
      wire::shrink_hello h;
      (void)!::recv(f, &h, sizeof h, MSG_WAITALL);
      struct {
        wire::verdict v;
        std::byte mac[wire::kMac] = {};
      } a;
      (void)!::send(f, &a, sizeof a, MSG_NOSIGNAL);  // "admitted", and a proof it cannot make
      std::this_thread::sleep_for(500ms);
      ::close(f);
      return;
    }
  });
  collx::shrink_request q;
  q.epoch = 1;
  q.id = "k1";
  q.timeout = 5s;
  q.what = "shrink #1";
  tcp_config cfg;
  std::string err;
  try {
    collx::transport::tcp_detail::shrinker(0, 2, "imp#s", "the-secret", {"", theirs_at.str()}, mine.get(), q, cfg).run();
  } catch (const std::exception& e) {
    err = e.what();
  }
  stranger.join();
  CHECK_THAT(err, Contains("does not prove it holds the job's secret") && Contains("rank 1"));
}
