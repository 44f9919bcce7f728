// Ranks as processes for device plans, without a GPU (features/device_ipc.hpp, tests/ipc_host.hpp): the
// descriptors passed over the ranks' Unix sockets, the rule for what a peer keeps mapped, and
// every collective x policy x N over real processes whose plans are walked on the host in the
// memory peer_group maps: posted addresses are (buffer, offset) pairs each receiver looks up
// in the table the call's exchange filled. What cuda::transport's process-ranks run, but the
// kernel and the CUDA calls.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "harness.hpp"
#include "ipc_host.hpp"
#include "leaks.hpp"
#include "matrix.hpp"

using namespace collx_test;
using namespace collx_test::ipc;
using Catch::Matchers::Contains;
namespace algo = collx::algo;

TEST_CASE("ipc: what a peer keeps mapped is the last 16 allocations posted from, most recent kept", "[ipc]") {
  dipc::lru_ids k(3);
  std::uint64_t ev = 0;
  CHECK(k.touch(1, ev));
  CHECK(ev == 0);
  CHECK(k.touch(2, ev));
  CHECK(k.touch(3, ev));
  CHECK_FALSE(k.touch(1, ev));  // kept, and now the most recent
  CHECK(k.touch(4, ev));
  CHECK(ev == 2);  // the least recently used
  CHECK(k.has(1));
  CHECK(k.has(3));
  CHECK_FALSE(k.has(2));
  CHECK(k.touch(2, ev));
  CHECK(ev == 3);
  CHECK(dipc::lru_ids().touch(7, ev));
  CHECK(dipc::kMappedPerPeer == 16);
}

TEST_CASE("ipc: descriptors pass between ranks' sockets, each found by its id whatever the order", "[ipc]") {
  const std::uint64_t nonce = (std::uint64_t(::getpid()) << 20) ^ 0x5eed;
  dipc::fd_channel a, b;
  a.open(nonce, 0);
  b.open(nonce, 1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::byte* x = memfd_alloc(4096);
  std::byte* y = memfd_alloc(4096);
  x[0] = std::byte{11};
  y[0] = std::byte{22};
  memfd_backend be;
  std::uint64_t off = 0;
  const auto dx = be.describe(x + 100, 10, off);
  CHECK(off == 100);
  const auto dy = be.describe(y, 4096, off);
  CHECK(dx.kind == dipc::handle_kind::fd);
  CHECK(be.describe(x + 4000, 200, off).kind == dipc::handle_kind::none);  // runs past its allocation
  std::vector<char> heap(64);
  CHECK(be.describe(reinterpret_cast<std::byte*>(heap.data()), 64, off).kind == dipc::handle_kind::none);
  for (const auto* d : {&dx, &dy}) {
    const int fd = be.export_fd(*d);
    a.send(1, d->id, fd, deadline);
    ::close(fd);
  }
  int checks = 0;
  const int fy = b.receive(0, dy.id, deadline, [&] { ++checks; });  // the later one first: the other waits in the stash
  const int fx = b.receive(0, dx.id, deadline, [&] { ++checks; });
  std::byte* my = be.import(dy, fy);
  std::byte* mx = be.import(dx, fx);
  ::close(fy);
  ::close(fx);
  CHECK(mx[0] == std::byte{11});
  CHECK(my[0] == std::byte{22});
  x[1] = std::byte{33};  // one memory, two mappings
  CHECK(mx[1] == std::byte{33});
  be.unmap(mx, dx);
  be.unmap(my, dy);
  // A descriptor that never comes: the wait asks check() (a peer's liveness) and ends at the deadline.
  const auto t = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(b.receive(0, 12345, t + std::chrono::milliseconds(200), [] {}), Contains("timed out waiting for rank 0"));
  CHECK_THROWS_WITH(b.receive(0, 12345, t + std::chrono::seconds(5), [] { throw std::runtime_error("rank 0 is gone"); }),
                    Contains("rank 0 is gone"));
  // To a rank whose socket is gone: said at once.
  CHECK_THROWS_WITH(a.send(7, 1, 0, deadline), Contains("its socket is gone"));
  memfd_free(x);
  memfd_free(y);
}

TEST_CASE("ipc: what a plan posts from and cannot be exported is staged, and an in and out that overlap as one", "[ipc]") {
  std::vector<std::byte> host(1000), stage0(1000), stage1(1000);
  std::vector<collx::local_copy_part> before, after;
  auto stage = [&](int slot, std::size_t) { return slot == 0 ? stage0.data() : stage1.data(); };
  const std::uint64_t extent[4] = {0, 100, 200, 50};
  std::byte* in = host.data();
  std::byte* out = host.data() + 300;
  {  // everything exportable: nothing moves
    std::byte* bufs[4] = {nullptr, in, out, nullptr};
    CHECK_FALSE(dipc::stage_buffers(bufs, extent, 2u | 4u, [](const std::byte*, std::uint64_t) { return true; }, stage, before, after));
    CHECK((bufs[1] == in && bufs[2] == out && before.empty() && after.empty()));
  }
  {  // only in cannot be exported, and only in is posted from: in staged, copied in, nothing back
    std::byte* bufs[4] = {nullptr, in, out, nullptr};
    auto exp = [&](const std::byte* p, std::uint64_t) { return p != in; };
    CHECK(dipc::stage_buffers(bufs, extent, 2u, exp, stage, before, after));
    CHECK(bufs[1] == stage0.data());
    CHECK(bufs[2] == out);
    REQUIRE(before.size() == 1);
    CHECK((before[0].dst == stage0.data() && before[0].src == in && before[0].bytes == 100));
    CHECK(after.empty());
  }
  {  // out cannot be exported but nothing is posted from it: left alone
    std::byte* bufs[4] = {nullptr, in, out, nullptr};
    auto exp = [&](const std::byte* p, std::uint64_t) { return p != out; };
    CHECK_FALSE(dipc::stage_buffers(bufs, extent, 2u, exp, stage, before, after));
  }
  {  // out posted from and not exportable: staged both ways, its content too
    std::byte* bufs[4] = {nullptr, in, out, nullptr};
    auto exp = [&](const std::byte* p, std::uint64_t) { return p != out; };
    CHECK(dipc::stage_buffers(bufs, extent, 4u, exp, stage, before, after));
    CHECK(bufs[2] == stage1.data());
    REQUIRE(after.size() == 1);
    CHECK((after[0].dst == out && after[0].src == stage1.data() && after[0].bytes == 200));
    CHECK(before.size() == 1);
  }
  {  // in place (reduce_scatter's out inside its in): one staging of the union, both rebased
    std::byte* bufs[4] = {nullptr, in, in + 40, nullptr};
    const std::uint64_t ext[4] = {0, 100, 20, 0};
    CHECK(dipc::stage_buffers(bufs, ext, 2u | 4u, [](const std::byte*, std::uint64_t) { return false; }, stage, before, after));
    CHECK(bufs[1] == stage1.data());
    CHECK(bufs[2] == stage1.data() + 40);
    REQUIRE(before.size() == 1);
    CHECK(before[0].bytes == 100);
    REQUIRE(after.size() == 1);
    CHECK((after[0].dst == in + 40 && after[0].src == stage1.data() + 40 && after[0].bytes == 20));
  }
}

namespace {
template <class A>
constexpr bool has_rs = std::is_same_v<A, algo::automatic> || requires(const A& a, const algo::rs_problem& p) { a.reduce_scatter(p); };
template <class A>
constexpr bool has_ar = has_rs<A> || requires(const A& a, const algo::ar_problem& p) { a.all_reduce(p); };
template <class A>
constexpr bool has_ag = std::is_same_v<A, algo::automatic> || requires(const A& a, const algo::ag_problem& p) { a.all_gather(p); };
template <class A>
constexpr bool has_root = std::is_same_v<A, algo::automatic> || (requires(const A& a, const algo::bcast_problem& p) { a.broadcast(p); } &&
                                                                 requires(const A& a, const algo::reduce_problem& p) { a.reduce(p); });

/// Every collective policy Algo has, on one group of n process-ranks, at every count of the
/// core's sweep, against the serial reference: one job per N, its group made once (as a job
/// makes it), every call exchanging and mapping anew. Returns "" or the first difference.
template <class Algo>
std::string ipc_matrix(int n) {
  return run_checked<processes_ipc<>>(n, [n](auto& comm, auto note) {
    const int r = comm.rank();
    const Algo a{};
    const collx::ops::sum op{};
    for (std::size_t count : counts_for(n)) {
      auto check = [&](const char* what, const std::string& s) {
        if (!s.empty()) note(std::string(what) + " of " + std::to_string(count) + ": " + s);
      };
      const std::size_t k = count / std::size_t(n) + (count % 2);
      if constexpr (has_ar<Algo>) {
        const auto in = inputs<float, collx::ops::sum>(r, count);
        std::vector<float> out(count);
        collx::all_reduce(comm, std::span<const float>{in}, std::span{out}, op, a);
        check("all_reduce", compare(out, reference<float>(op, n, count)));
        auto b = inputs<std::int32_t, collx::ops::sum>(r, count);
        collx::all_reduce(comm, std::span{b}, op, a);
        check("all_reduce in place", compare(b, reference<std::int32_t>(op, n, count)));
      }
      if constexpr (has_rs<Algo>) {
        const auto in = inputs<float, collx::ops::sum>(r, k * std::size_t(n));
        std::vector<float> out(k);
        collx::reduce_scatter(comm, std::span<const float>{in}, std::span{out}, op, a);
        const auto want = reference<float>(op, n, k * std::size_t(n));
        check("reduce_scatter", compare(out, std::vector<float>(want.begin() + std::ptrdiff_t(k) * r, want.begin() + std::ptrdiff_t(k) * (r + 1))));
      }
      if constexpr (has_root<Algo>) {
        const auto in = inputs<std::int32_t, collx::ops::sum>(r, count);
        std::vector<std::int32_t> out(r == n - 1 ? count : 0);
        collx::reduce(comm, std::span<const std::int32_t>{in}, std::span{out}, op, n - 1, a);
        if (r == n - 1) check("reduce", compare(out, reference<std::int32_t>(op, n, count)));
        std::vector<std::int32_t> buf(count), want(count);
        for (std::size_t i = 0; i < count; ++i) buf[i] = payload<std::int32_t>(r, i), want[i] = payload<std::int32_t>(n / 2, i);
        collx::broadcast(comm, std::span{buf}, n / 2, a);
        check("broadcast", compare(buf, want));
      }
      if constexpr (has_ag<Algo>) {
        std::vector<float> in(k), out(k * std::size_t(n)), want(k * std::size_t(n));
        for (std::size_t i = 0; i < k; ++i) in[i] = payload<float>(r, i);
        for (int q = 0; q < n; ++q)
          for (std::size_t i = 0; i < k; ++i) want[std::size_t(q) * k + i] = payload<float>(q, i);
        collx::all_gather(comm, std::span<const float>{in}, std::span{out}, a);
        check("all_gather", compare(out, want));
      }
    }
  });
}
}  // namespace

TEMPLATE_TEST_CASE("ipc: every collective over processes walking device plans equals the serial reference", "[ipc]", algo::ring,
                   algo::tree, algo::recursive_halving, algo::recursive_doubling, algo::pairwise, algo::automatic) {
  for (int n : process_ranks()) {
    CAPTURE(n);
    CHECK(ipc_matrix<TestType>(n) == "");
  }
}

TEST_CASE("ipc: every dtype and op, all_to_all_v, messages cut into many chunks, opaque handles, in place", "[ipc]") {
  for (int n : {3, 8}) check_dtypes_and_ops<processes_ipc<>>(n);
  for (int n : {1, 2, 5}) CHECK(run_all_to_all_v<processes_ipc<>>(n) == "");
  using chunky = processes_ipc<dipc::handle_kind::fd, 64>;
  using opaque = processes_ipc<dipc::handle_kind::opaque>;
  for (int n : {2, 3, 7}) {
    CAPTURE(n);
    CHECK(run_all_reduce<float, collx::ops::sum, algo::ring, chunky>(n, 10007, false) == "");
    CHECK(run_all_gather<std::int32_t, algo::tree, chunky>(n, 1001) == "");
    CHECK(run_all_reduce<float, collx::ops::sum, algo::ring, opaque>(n, 10007, true) == "");
    CHECK(run_broadcast<std::int32_t, algo::tree, opaque>(n, 10007, n - 1) == "");
  }
  // in place: reduce_scatter's output inside its input, all_gather's input inside its output
  for (int n : {2, 3, 5}) {
    CAPTURE(n);
    CHECK(run_reduce_scatter_in_place<float, collx::ops::sum, algo::ring, processes_ipc<>>(n, 1001) == "");
    CHECK(run_all_gather_in_place<float, algo::recursive_halving, processes_ipc<>>(n, 1001) == "");
  }
}

namespace {
/// Rank r's element i of call c.
std::int64_t val(int r, std::size_t i, int c) { return std::int64_t(r + 1) * 1000003 + std::int64_t(i) * 7 + c * 13; }
}  // namespace

TEST_CASE("ipc: buffers in exportable memory are mapped by the peers, not staged, and freed ones are unmapped", "[ipc]") {
  for (auto mode : {dipc::handle_kind::fd, dipc::handle_kind::opaque}) {
    CAPTURE(int(mode));
    for (int n : {2, 3, 5}) {
      CAPTURE(n);
      const std::string r = run_checked<processes_any>(n, [&](auto& job, auto note) {
        memfd_backend be;
        be.mode = mode;
        collx::communicator<ipc_planned> comm{ipc_planned(job.split(0, job.rank(), "ipc-boot"), be)};
        const int me = comm.rank();
        const std::size_t count = 5003;
        // 40 calls, each on buffers allocated for it and freed after: more allocations than a
        // peer keeps mapped, and the allocator hands the same addresses out again, which
        // mappings found by address instead of by id would read stale.
        bool wrong = false;
        for (int c = 0; c < 40 && !wrong; ++c) {
          shared_vec<std::int64_t> in(count), out(count);
          for (std::size_t i = 0; i < count; ++i) in.p[i] = val(me, i, c);
          if (c % 2 == 0) collx::all_reduce(comm, in.cspan(), out.span(), collx::ops::sum{}, algo::ring{});
          else collx::all_reduce(comm, in.span(), collx::ops::sum{}, algo::tree{});
          const std::int64_t* got = c % 2 == 0 ? out.p : in.p;
          for (std::size_t i = 0; i < count; ++i) {
            std::int64_t want = 0;
            for (int q = 0; q < n; ++q) want += val(q, i, c);
            if (got[i] != want) {
              note("call " + std::to_string(c) + " wrong at " + std::to_string(i));
              wrong = true;
              break;
            }
          }
        }
        // and on the same buffers again and again: mapped once
        shared_vec<std::int64_t> keep(count);
        auto& b = comm.transport().grp().backend();
        const int before = b.imports;
        for (int c = 0; c < 10; ++c) {
          for (std::size_t i = 0; i < count; ++i) keep.p[i] = val(me, i, c);
          collx::all_reduce(comm, keep.span(), collx::ops::sum{}, algo::ring{});
        }
        if (n > 1 && b.imports - before > n - 1) note("the same buffer was mapped again: " + std::to_string(b.imports - before));
        if (comm.transport().staged() != 0) note("a buffer in exportable memory was staged");
        // every peer's allocations beyond the last 16 were unmapped
        const int kept = b.imports - b.unmaps, regions = n - 1;
        if (kept > regions + (n - 1) * int(dipc::kMappedPerPeer))
          note("more mapped than the rule keeps: " + std::to_string(kept));
        if (n > 1 && b.unmaps < (n - 1) * (40 - int(dipc::kMappedPerPeer)))
          note("too few unmapped: " + std::to_string(b.unmaps));
      });
      CHECK(r == "");
    }
  }
}

TEST_CASE("ipc: an opaque handle's owner frees its buffer as soon as its call returns - a peer that maps it late still finds it",
          "[ipc]") {
  // A ring broadcast from 0 is a chain 0 -> 1 -> 2: rank 2 maps rank 0's buffer but never reads
  // it, so rank 0 is done once rank 1 has its data, and frees its buffer while rank 2, slow to
  // map, has not opened it yet (ctest under ASan saw "cannot open /proc/<pid>/fd/<n>" so).
  const std::string r = run_checked<processes_any>(3, [&](auto& job, auto note) {
    memfd_backend be;
    be.mode = dipc::handle_kind::opaque;
    if (job.rank() == 2) be.delay_import = std::chrono::milliseconds(300);
    collx::communicator<ipc_planned> comm{ipc_planned(job.split(0, job.rank(), "ipc-boot"), be)};
    for (int c = 0; c < 3; ++c) {
      shared_vec<std::int64_t> v(1001);
      for (std::size_t i = 0; i < 1001; ++i) v.p[i] = comm.rank() == 0 ? val(0, i, c) : -1;
      collx::broadcast(comm, v.span(), 0, algo::ring{});
      for (std::size_t i = 0; i < 1001; ++i)
        if (v.p[i] != val(0, i, c)) {
          note("call " + std::to_string(c) + " wrong at " + std::to_string(i));
          break;
        }
    }  // (each buffer freed as its call returns)
  });
  CHECK(r == "");
}

TEST_CASE("ipc: host buffers are staged through exportable memory", "[ipc]") {
  const std::string r = run_checked<processes_any>(3, [&](auto& job, auto note) {
    collx::communicator<ipc_planned> comm{ipc_planned(job.split(0, job.rank(), "ipc-boot"))};
    std::vector<float> v(1001, float(comm.rank() + 1));
    collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    note(v[0] == 6.0f && v[1000] == 6.0f ? "" : "wrong sum");
    note(comm.transport().staged() == 1 ? "" : "not staged");
  });
  CHECK(r == "");
}

TEST_CASE("ipc: mismatched calls fail at the exchange, naming both calls", "[ipc][errors]") {
  check_mismatches([](int n, auto f, const collx::options& o) { processes_ipc<>{}(n, f, o); });
}

TEST_CASE("ipc: a rank whose process dies is named by every other rank at once, a late one by the deadline", "[ipc][errors]") {
  collx::options o;
  o.timeout = std::chrono::seconds(20);
  const auto t = std::chrono::steady_clock::now();
  try {
    processes_ipc<>{}(4, [](auto& comm) {
      std::vector<float> v(100003, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      if (comm.rank() == 2) ::kill(::getpid(), SIGKILL);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    }, o);
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK_THAT(e.what(), Contains("rank 2"));
  }
  CHECK(std::chrono::steady_clock::now() - t < std::chrono::seconds(10));  // not the 20 s deadline
  o.timeout = std::chrono::milliseconds(400);
  try {
    processes_ipc<>{}(2, [](auto& comm) {
      std::vector<float> v(1000, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    }, o);
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK_THAT(e.what(), Contains("timed out") && Contains("rank 1"));
  }
}

TEST_CASE("ipc: a group made and unmade leaves no descriptor or mapping behind", "[ipc]") {
  const std::string r = run_checked<processes_any>(3, [&](auto& job, auto note) {
    const auto fds = open_fds();
    for (int k = 0; k < 3; ++k) {
      collx::communicator<ipc_planned> comm{ipc_planned(job.split(0, job.rank(), "ipc-boot"))};
      shared_vec<float> v(777);
      for (std::size_t i = 0; i < v.n; ++i) v.p[i] = float(comm.rank());
      collx::all_reduce(comm, v.span(), collx::ops::sum{}, algo::tree{});
      note(v.p[776] == 3.0f ? "" : "wrong sum");
    }
    const auto after = open_fds();
    for (const auto& f : after)
      if (!fds.count(f)) note("left open: " + f);
  });
  CHECK(r == "");
}
