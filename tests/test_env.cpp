// Every environment variable collx reads is listed once (collx::env::variables, core/settings.hpp) and in
// the README's table, is read through core/settings.hpp's one reader, and a value that does not parse is an
// error naming the variable, never a silent default.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "harness.hpp"
#include "scratch.hpp"

using Catch::Matchers::Contains;
using collx_test::scoped_env;

namespace {
std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const collx::error& e) {
    return e.code() == collx::errc::invalid_argument ? std::string(e.what()) : "wrong code: " + std::string(e.what());
  }
  return "no error";
}
}  // namespace

TEST_CASE("every COLLX_* variable the headers read is in env::variables and in the README's table", "[env]") {
  const std::filesystem::path root = COLLX_SOURCE_DIR;
  std::set<std::string> read;
  const std::regex literal("\"(COLLX_[A-Z0-9_]+)\"");
  for (const auto& e : std::filesystem::recursive_directory_iterator(root / "include" / "collx")) {
    if (!e.is_regular_file()) continue;
    const std::string text = slurp(e.path());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), literal); it != std::sregex_iterator(); ++it)
      read.insert((*it)[1]);
  }
  REQUIRE(read.size() >= 14);
  const std::string readme = slurp(root / "README.md");
  for (const auto& name : read) {
    CAPTURE(name);
    CHECK(collx::env::find(name) != nullptr);
    CHECK_THAT(readme, Contains("| `" + name + "` |"));
  }
  for (const auto& v : collx::env::variables) {
    CAPTURE(v.name);
    CHECK(read.count(v.name) == 1);  // nothing listed that nothing reads
  }
}

TEST_CASE("every test case's name is one ctest can run: no semicolon in it", "[env][tests]") {
  // catch_discover_tests hands each name to CMake, which splits it at a ';' into a list: the
  // test registered under the first piece then matches no case, runs nothing and passes. Six
  // cases ran so, as tests that could not fail, until this was found (2026-12-06).
  const std::filesystem::path root = COLLX_SOURCE_DIR;
  const std::regex head(R"re((TEMPLATE_)?TEST_CASE\()re");
  const std::regex literal(R"re(^\s*"((?:[^"\\]|\\.)*)")re");
  int cases = 0;
  for (const auto& e : std::filesystem::directory_iterator(root / "tests")) {
    if (e.path().extension() != ".cpp") continue;
    const std::string text = slurp(e.path());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), head); it != std::sregex_iterator(); ++it) {
      std::string name;  // its string literals, adjacent ones joined
      std::size_t at = std::size_t(it->position() + it->length());
      std::smatch m;
      while (std::regex_search(text.cbegin() + std::ptrdiff_t(at), text.cend(), m, literal)) {
        name += m[1].str();
        at += std::size_t(m.length(0));
      }
      ++cases;
      CAPTURE(e.path().filename().string(), name);
      CHECK(name.find(';') == std::string::npos);
    }
  }
  CHECK(cases > 200);  // (it found them: 214 at the time of writing)
}

TEST_CASE("a value that does not parse is an error naming the variable", "[env]") {
  {
    scoped_env e("COLLX_SHM_SINGLE_COPY_BYTES", "lots");  // before: silently "never"
    CHECK_THAT(error_of([] { collx::transport::shm::config c; (void)c; }), Contains("COLLX_SHM_SINGLE_COPY_BYTES=\"lots\""));
  }
  {
    scoped_env e("COLLX_SHM_SINGLE_COPY_BYTES", "64K");
    CHECK(collx::transport::shm::config{}.single_copy_forced_bytes == 65536);
  }
  {
    scoped_env e("COLLX_SHM_SINGLE_COPY_BYTES", "0");
    CHECK(collx::transport::shm::config{}.single_copy_never());
  }
  {
    scoped_env e("COLLX_SHM_SLOTS", "0");
    CHECK_THAT(error_of([] { collx::transport::shm::config c; (void)c; }), Contains("COLLX_SHM_SLOTS=\"0\""));
  }
  {
    scoped_env e("COLLX_SHM_SLOT_BYTES", "16M");
    CHECK(collx::transport::shm::config{}.slot_bytes == std::size_t(16) << 20);
  }
  {
    scoped_env e("COLLX_SHM_SLOT_BYTES", "1G");  // more than a chunk's 32-bit size field may carry
    CHECK_THAT(error_of([] { collx::transport::shm::config c; (void)c; }), Contains("COLLX_SHM_SLOT_BYTES"));
  }
  {
    scoped_env e("COLLX_TCP_BUFFER_BYTES", "-1");
    CHECK_THAT(error_of([] { collx::transport::tcp_config c; (void)c; }), Contains("COLLX_TCP_BUFFER_BYTES=\"-1\""));
  }
  {
    scoped_env e("COLLX_SCHEDULE_CACHE_BYTES", "12 MB");
    CHECK_THAT(error_of([] { (void)collx::detail::schedule_cache::default_budget(); }), Contains("COLLX_SCHEDULE_CACHE_BYTES"));
  }
  {
    scoped_env e("COLLX_TIMEOUT_S", "soon");
    CHECK_THAT(error_of([] { collx::options o; (void)o; }), Contains("COLLX_TIMEOUT_S=\"soon\""));
  }
  {
    scoped_env e("COLLX_ALGO", "rign");
    CHECK_THAT(error_of([] {
      collx::launch_threads(2, [](auto& comm) {
        std::vector<float> v(8);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
      });
    }), Contains("COLLX_ALGO=\"rign\""));
  }
  // the byte reader's grammar
  CHECK(collx::detail::parse_bytes("X", "65536", 0, ~0ull) == 65536);
  CHECK(collx::detail::parse_bytes("X", "64KiB", 0, ~0ull) == 65536);
  CHECK(collx::detail::parse_bytes("X", "2G", 0, ~0ull) == std::uint64_t(2) << 30);
  CHECK_THROWS_AS(collx::detail::parse_bytes("X", "1.5M", 0, ~0ull), collx::error);
  CHECK_THROWS_AS(collx::detail::parse_bytes("X", "99999999999999999999", 0, ~0ull), collx::error);
  CHECK_THROWS_AS(collx::detail::parse_bytes("X", "17179869184G", 0, ~0ull), collx::error);  // wraps when shifted
}

TEST_CASE("a slot too large for a chunk's size field is refused", "[env][overflow]") {
  collx::transport::shm::config c;
  c.slot_bytes = std::size_t(8) << 30;  // a chunk's size travels in 32 bits
  CHECK_THAT(error_of([&] { collx::transport::shm t("x", 0, 1, c); }), Contains("slot_bytes"));
}

TEST_CASE("torchrun's job name differs by rendezvous address, port and restart, not only by run id", "[env]") {
  // torchrun sets TORCHELASTIC_RUN_ID=none for every job unless told otherwise: a name made of
  // the run id alone was the same for two jobs at once on one host, and for an elastic restart.
  scoped_env rank("RANK", "0"), size("WORLD_SIZE", "2"), id("TORCHELASTIC_RUN_ID", "none");
  auto name = [] { return collx::launch_info_from_env().job; };
  std::string a, b, c, d;
  {
    scoped_env addr("MASTER_ADDR", "127.0.0.1"), port("MASTER_PORT", "29500");
    a = name();
    scoped_env restart("TORCHELASTIC_RESTART_COUNT", "1");
    d = name();
  }
  {
    scoped_env addr("MASTER_ADDR", "127.0.0.1"), port("MASTER_PORT", "29501");
    b = name();
  }
  {
    scoped_env addr("MASTER_ADDR", "10.0.0.7"), port("MASTER_PORT", "29500");
    c = name();
  }
  CHECK(a != b);
  CHECK(a != c);
  CHECK(a != d);
  CHECK_THAT(a, Contains("none") && Contains("127.0.0.1") && Contains("29500"));
  {
    scoped_env addr("MASTER_ADDR", "127.0.0.1"), port("MASTER_PORT", "29500");
    CHECK(name() == a);  // every rank of one job, and a rerun, computes the same name
    scoped_env job("COLLX_JOB", "mine");
    CHECK(name() == "mine");
  }
  CHECK_THAT(error_of([] {
    scoped_env rank("RANK", "0"), size("WORLD_SIZE", "2");
    ::unsetenv("TORCHELASTIC_RUN_ID");
    (void)collx::launch_info_from_env();
  }), Contains("COLLX_JOB"));
}
