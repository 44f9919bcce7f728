// transport::two_level (a node's ranks over one transport, every other pair over another) and
// algo::two_level (node-aware collectives) and the machine placement, against the serial reference: thread-ranks laid out
// on "nodes" (inproc within and across), and processes (shm within each node, tcp across, the
// node map gathered from each rank's COLLX_NODE as from_env() gathers host names).
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <collx/collx.hpp>

#include "harness.hpp"
#include "matrix.hpp"
#include "scratch.hpp"

namespace algo = collx::algo;
using collx::node_map;

namespace {

/// How a test lays n ranks out on nodes.
enum class layout {
  pairs,        // nodes of 2, numbered node by node (the last holds 1 when n is odd)
  round_robin,  // 2 nodes, ranks dealt out in turn (0, 2, 4 | 1, 3, 5)
  uneven,       // nodes of 3 and 2 in turn, node by node
};

node_map lay_out(int n, layout k) {
  std::vector<int> sizes;
  const int per = k == layout::round_robin ? (n + 1) / 2 : 2;
  for (int left = n, i = 0; left > 0; ++i) {
    const int s = std::min(left, k == layout::uneven ? (i % 2 == 0 ? 3 : 2) : per);
    sizes.push_back(s);
    left -= s;
  }
  return node_map::of_sizes(sizes, k == layout::round_robin);
}

template <layout K>
struct node_threads {
  template <class F>
  void operator()(int n, F&& f, collx::options o = {}) const {
    collx::launch_node_threads(lay_out(n, K), std::forward<F>(f), o);
  }
};
template <layout K>
struct node_processes {
  template <class F>
  void operator()(int n, F&& f, collx::options o = {}) const {
    collx::launch_node_processes(lay_out(n, K), std::forward<F>(f), o);
  }
};

/// Bytes every node sends to other nodes in rank `r`'s schedule of an all_reduce of `count`
/// elements of `e` bytes: summed over all ranks, per node.
template <class Build>
std::vector<std::uint64_t> bytes_out_of_nodes(const node_map& nm, std::size_t e, Build build) {
  std::vector<std::uint64_t> by_node(std::size_t(nm.nodes()), 0);
  for (int r = 0; r < nm.size(); ++r) {
    const collx::schedule s = build(r);
    for (const auto& x : s.sends())
      if (!nm.same_node(r, x.peer)) by_node[std::size_t(nm.node_of[std::size_t(r)])] += x.src.count * e;
  }
  return by_node;
}

}  // namespace

TEST_CASE("node maps: from keys, node by node, round robin, restricted to a split's ranks", "[two_level]") {
  const node_map a = node_map::of_sizes({3, 2});
  CHECK(a.node_of == std::vector<int>{0, 0, 0, 1, 1});
  CHECK(a.local_of == std::vector<int>{0, 1, 2, 0, 1});
  CHECK(a.widest() == 3);
  const node_map b = node_map::of_sizes({3, 2}, true);
  CHECK(b.node_of == std::vector<int>{0, 1, 0, 1, 0});
  CHECK(b.members[1] == std::vector<int>{1, 3});
  const node_map c = b.restricted({4, 3, 1});
  CHECK(c.node_of == std::vector<int>{0, 1, 1});
  CHECK(c.describe() == "node 0: rank 0; node 1: ranks 1, 2");
  const node_map d = node_map::from_keys(4, [](int r) { return std::string(r == 2 ? "b" : "a"); });
  CHECK(d.members == std::vector<std::vector<int>>{{0, 1, 3}, {2}});
  CHECK(node_map::of_sizes({4}).flat());
  CHECK(node_map::of_sizes({1, 1, 1}).flat());
  CHECK(!node_map::of_sizes({2, 1}).flat());
}

TEST_CASE("algo::two_level: the bytes that cross between nodes are 2(M-1)/M x D per node, and fewer than the flat ring's", "[two_level]") {
  const std::size_t count = 16 * 9 * 5 * 7 * 64, e = 4;  // divides into every shard, rail block and ring block here
  const std::uint64_t D = count * e;
  for (const auto& [sizes, rr] : std::vector<std::pair<std::vector<int>, bool>>{{{2, 2}, false}, {{2, 2}, true}, {{2, 2, 2}, false},
                                                                                {{4, 4}, true}, {{3, 3, 3}, false}}) {
    const node_map nm = node_map::of_sizes(sizes, rr);
    const int N = nm.size(), M = nm.nodes();
    CAPTURE(nm.describe());
    const auto two = bytes_out_of_nodes(nm, e, [&](int r) {
      return algo::two_level{}.all_reduce(algo::ar_problem{r, N, count, e, true, collx::buf::in}, nm);
    });
    const auto flat = bytes_out_of_nodes(nm, e, [&](int r) {
      return algo::composed_segment(algo::ring{}, algo::ar_problem{r, N, count, e, true, collx::buf::in});
    });
    for (int j = 0; j < M; ++j) {
      CAPTURE(j);
      CHECK(two[std::size_t(j)] == 2 * std::uint64_t(M - 1) * D / std::uint64_t(M));
      CHECK(two[std::size_t(j)] < flat[std::size_t(j)]);
    }
    // Numbered node by node the flat ring crosses on M links, each 2(N-1)/N x D; round robin on all N.
    const std::uint64_t per_link = 2 * std::uint64_t(N - 1) * D / std::uint64_t(N);
    std::uint64_t total = 0;
    for (auto b : flat) total += b;
    CHECK(total == per_link * std::uint64_t(rr ? N : M));
  }
}

TEST_CASE("algo::two_level all_reduce over nodes of threads: every layout, rank count and count", "[two_level]") {
  for (int n : {1, 2, 3, 4, 5, 7, 8})
    for (std::size_t count : collx_test::counts_for(n)) {
      CAPTURE(n, count);
      CHECK(collx_test::run_all_reduce<float, collx::ops::sum, algo::two_level, node_threads<layout::pairs>>(n, count, false) == "");
      CHECK(collx_test::run_all_reduce<std::int32_t, collx::ops::sum, algo::two_level, node_threads<layout::round_robin>>(n, count, true) == "");
      CHECK(collx_test::run_all_reduce<double, collx::ops::max, algo::two_level, node_threads<layout::uneven>>(n, count, false) == "");
    }
  // Large shards cross by the ring, small ones by recursive doubling (algo::two_level::doubling_bytes);
  // above 2 MiB the segments run as a pipeline (2 segments here, then 8).
  CHECK(collx_test::run_all_reduce<float, collx::ops::sum, algo::two_level, node_threads<layout::uneven>>(13, 1000003, true) == "");
  CHECK(collx_test::run_all_reduce<float, collx::ops::sum, algo::two_level, node_threads<layout::round_robin>>(5, 5000011, false) == "");
  CHECK(collx_test::run_all_reduce<collx::bfloat16, collx::ops::avg, algo::two_level, node_threads<layout::pairs>>(5, 100003, false) == "");
  CHECK(collx_test::run_all_reduce<collx::half, collx::ops::sum, algo::two_level, node_threads<layout::round_robin>>(6, 4099, true) == "");
  // On a communicator with no node map, one node: the node's reduce-scatter and all-gather.
  CHECK(collx_test::run_all_reduce<float, collx::ops::sum, algo::two_level>(5, 100003, false) == "");
}

TEST_CASE("algo::two_level reduce_scatter, all_gather, broadcast and reduce over nodes of threads", "[two_level]") {
  collx_test::check_reducing_matrix<node_threads<layout::round_robin>, algo::two_level>({1, 2, 3, 5, 8});
  collx_test::check_moving_matrix<node_threads<layout::uneven>, algo::two_level>({2, 3, 5, 7});
  collx_test::check_reducing_matrix<node_threads<layout::uneven>, algo::two_level>({7});
  collx_test::check_moving_matrix<node_threads<layout::pairs>, algo::two_level>({5, 8});
  // Every root, and sizes on each side of small_bytes and doubling_bytes (the binomial tree or
  // the chain on a rail), in place too.
  for (int root = 0; root < 5; ++root)
    for (std::size_t count : {std::size_t(1000), std::size_t(5003), std::size_t(70001)}) {
      CAPTURE(root, count);
      CHECK(collx_test::run_broadcast<float, algo::two_level, node_threads<layout::uneven>>(5, count, root) == "");
      CHECK(collx_test::run_reduce<float, collx::ops::sum, algo::two_level, node_threads<layout::round_robin>>(5, count, root) == "");
      CHECK(collx_test::run_reduce<double, collx::ops::max, algo::two_level, node_threads<layout::uneven>>(5, count, root) == "");
    }
  for (int n : {3, 6}) {
    CAPTURE(n);
    CHECK(collx_test::run_reduce_scatter_in_place<std::int32_t, collx::ops::sum, algo::two_level, node_threads<layout::uneven>>(n, 1001) == "");
    CHECK(collx_test::run_all_gather_in_place<float, algo::two_level, node_threads<layout::round_robin>>(n, 1001) == "");
    CHECK(collx_test::run_reduce_scatter<collx::bfloat16, collx::ops::avg, algo::two_level, node_threads<layout::pairs>>(n, 30011) == "");
  }
}

TEST_CASE("algo::two_level reduce_scatter and all_gather: (M-1)/M x D cross between nodes per node, fewer than the flat ring's", "[two_level]") {
  const std::size_t k = 9 * 5 * 7 * 64, e = 4;  // a block's elements
  for (const auto& [sizes, rr] : std::vector<std::pair<std::vector<int>, bool>>{{{2, 2}, false}, {{2, 2}, true}, {{2, 2, 2}, false},
                                                                                {{4, 4}, true}, {{3, 3, 3}, false}}) {
    const node_map nm = node_map::of_sizes(sizes, rr);
    const int N = nm.size(), M = nm.nodes();
    CAPTURE(nm.describe());
    const collx::partition blocks(k * std::size_t(N), N);
    const std::uint64_t D = k * std::size_t(N) * e;
    const auto rs = bytes_out_of_nodes(nm, e, [&](int r) {
      return algo::two_level{}.reduce_scatter(algo::rs_problem{r, N, blocks, collx::buf::in, collx::buf::none, e, true}, nm);
    });
    const auto ag = bytes_out_of_nodes(nm, e, [&](int r) {
      return algo::two_level{}.all_gather(algo::ag_problem{r, N, blocks, false, 0, e}, nm);
    });
    const auto flat = bytes_out_of_nodes(nm, e, [&](int r) {
      return algo::ring{}.reduce_scatter(algo::rs_problem{r, N, blocks, collx::buf::in, collx::buf::none, e, true});
    });
    for (int j = 0; j < M; ++j) {
      CAPTURE(j);
      CHECK(rs[std::size_t(j)] == std::uint64_t(M - 1) * D / std::uint64_t(M));
      CHECK(ag[std::size_t(j)] == rs[std::size_t(j)]);
      CHECK(rs[std::size_t(j)] < flat[std::size_t(j)]);
    }
  }
}

// Flat policies over a two-level communicator: steps with peers on both transports at once.
TEMPLATE_TEST_CASE("flat policies over nodes of threads (a step's peers on both levels)", "[two_level]", algo::ring, algo::tree,
                   algo::recursive_halving, algo::recursive_doubling, algo::pairwise, algo::automatic) {
  if constexpr (!std::is_same_v<TestType, algo::recursive_doubling> && !std::is_same_v<TestType, algo::pairwise>)
    collx_test::check_reducing_matrix<node_threads<layout::round_robin>, TestType>({1, 2, 3, 5, 8});
  if constexpr (!std::is_same_v<TestType, algo::recursive_doubling>)
    collx_test::check_moving_matrix<node_threads<layout::uneven>, TestType>({2, 3, 5, 7});
  if constexpr (!std::is_same_v<TestType, algo::pairwise>)
    for (int n : {2, 5, 8}) {
      CAPTURE(n);
      CHECK(collx_test::run_all_reduce<float, collx::ops::sum, TestType, node_threads<layout::pairs>>(n, 100003, true) == "");
    }
}

TEST_CASE("the two-level model: two_level where bytes cross between nodes, within its schedules' reach", "[two_level][model]") {
  // Shared memory inside the nodes, tcp between them: the shipped defaults.
  const collx::model::levels lv{collx::model::shipped_defaults("shm"), collx::model::shipped_defaults("tcp")};
  for (const auto& [sizes, rr] : std::vector<std::pair<std::vector<int>, bool>>{{{2, 2}, false}, {{2, 2}, true}, {{3, 3}, false}, {{3, 2}, true}}) {
    const node_map nm = node_map::of_sizes(sizes, rr);
    CAPTURE(nm.describe());
    for (auto c : {collx::algo::collective::all_reduce, collx::algo::collective::reduce_scatter, collx::algo::collective::all_gather,
                   collx::algo::collective::broadcast, collx::algo::collective::reduce}) {
      CAPTURE(collx::model::name(c));
      const auto pr = collx::model::problem::of_bytes(c, nm.size(), std::size_t(64) << 20);
      const auto v = collx::model::evaluate_on_nodes(pr, nm, lv);
      const auto b = collx::model::best_on_nodes(pr, nm, lv);
      // two_level sends the fewest bytes between nodes of all the candidates, and the pick is the
      // least predicted time
      const auto two = std::find_if(v.begin(), v.end(), [](auto& y) { return y.two_level; });
      REQUIRE(two != v.end());
      for (const auto& x : v) {
        CHECK(x.between_nodes >= two->between_nodes);
        CHECK(b.seconds <= x.seconds);
      }
      // all_reduce: two_level in every layout. (A flat policy can tie elsewhere: a broadcast's
      // chain numbered node by node crosses once per node, as the rails do, in one pipeline; a
      // binomial tree or recursive halving dealt out round robin pairs node-mates first.)
      if (c == collx::algo::collective::all_reduce) CHECK(b.two_level);
    }
  }
  // Links alike on both levels, one node's ranks consecutive: at 8 bytes the candidates' steps
  // decide, and the model's pick is the least predicted.
  const node_map nm = node_map::of_sizes({2, 2});
  const collx::model::levels same{collx::model::shipped_defaults("tcp"), collx::model::shipped_defaults("tcp")};
  const auto pr = collx::model::problem::of_bytes(collx::algo::collective::all_reduce, 4, 8);
  const auto v = collx::model::evaluate_on_nodes(pr, nm, same);
  const auto b = collx::model::best_on_nodes(pr, nm, same);
  for (const auto& x : v) CHECK(b.seconds <= x.seconds);
}

TEST_CASE("algo::automatic on a communicator on several nodes: the two-level model's pick, unless COLLX_ALGO names a policy", "[two_level]") {
  std::vector<std::string> ran(4), want(4);
  auto policies = [&](auto& comm) {
    std::string w;
    for (std::size_t count : {std::size_t(2), std::size_t(100003)}) {
      std::vector<float> v(count, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
      if (v[count - 1] != float(comm.size())) throw std::runtime_error("wrong sum");
      // what the model predicts with the levels automatic_setup gathered
      const auto& st = comm.automatic();
      auto params = [](const auto& x) { return collx::model::params{x.alpha, x.beta, x.gamma, {}, x.cores, x.ranks, x.delta, x.curve, x.fit}; };
      const auto b = collx::model::best_on_nodes(collx::model::problem{collx::algo::collective::all_reduce, comm.size(), count, 4, 0, true},
                                                 comm.transport().nodes(), collx::model::levels{params(st.node), params(st.net)});
      w += std::string(b.two_level ? "two_level" : collx::model::name(b.policy)) + " ";
    }
    std::string s;
    for (const auto& rec : collx::flight::records(comm))
      if (std::string(rec.sig.collective, strnlen(rec.sig.collective, sizeof rec.sig.collective)) == "all_reduce")
        s += std::string(rec.sig.policy, strnlen(rec.sig.policy, sizeof rec.sig.policy)) + " ";
    ran[std::size_t(comm.rank())] = s;
    want[std::size_t(comm.rank())] = w;
  };
  collx::launch_node_threads(lay_out(4, layout::round_robin), policies);
  for (int r = 0; r < 4; ++r) CHECK(ran[std::size_t(r)] == want[std::size_t(r)]);
  {
    const collx_test::scoped_env e("COLLX_ALGO", "all_reduce=ring");
    collx::launch_node_threads(lay_out(4, layout::round_robin), policies);
    for (const auto& s : ran) CHECK(s == "ring ring ");
  }
  // COLLX_ALGO names two_level, for every collective or for one: it runs at both sizes (named
  // for another collective, all_reduce takes the global name)
  for (const char* v : {"two_level", "tree,all_reduce=two_level", "two_level,broadcast=ring"}) {
    const collx_test::scoped_env e("COLLX_ALGO", v);
    collx::launch_node_threads(lay_out(4, layout::round_robin), policies);
    for (const auto& s : ran) CHECK(s == "two_level two_level ");
  }
  // One node: nothing for two levels to do; the model chooses as on any communicator, and so
  // it does where COLLX_ALGO names two_level.
  std::string model_alone;
  for (const char* v : {"", "two_level"}) {
    const collx_test::scoped_env e("COLLX_ALGO", v);
    collx::launch_node_threads(lay_out(2, layout::pairs), policies);
    CHECK(ran[0].find("two_level") == std::string::npos);
    if (*v == 0) model_alone = ran[0];
    else CHECK(ran[0] == model_alone);
  }
  // The link between nodes is measured at the first call where the two-level model runs
  // (several nodes, not one rank on each), and every rank takes rank 0's numbers; with one rank
  // a node, or COLLX_PROBE_LINK=0, nothing is measured
  std::vector<std::string> src(4);
  std::vector<double> beta(4);
  auto source = [&](auto& comm) {
    float x = 1;
    collx::all_reduce(comm, std::span{&x, 1}, collx::ops::sum{});
    src[std::size_t(comm.rank())] = comm.automatic().source;
    beta[std::size_t(comm.rank())] = comm.automatic().net.beta;
  };
  collx::launch_node_threads(lay_out(4, layout::pairs), source);
  for (int r = 0; r < 4; ++r) {
    CHECK(src[std::size_t(r)].find("between nodes measured now (ranks 0 and 2)") != std::string::npos);
    CHECK(beta[std::size_t(r)] == beta[0]);
  }
  CHECK(beta[0] > 0);
  {
    const collx_test::scoped_env off("COLLX_PROBE_LINK", "0");
    collx::launch_node_threads(lay_out(4, layout::pairs), source);
    CHECK(src[0].find("measured now") == std::string::npos);
  }
  src.assign(4, "");
  collx::launch_node_threads(collx::node_map::of_sizes({1, 1}), source);
  CHECK(src[0].find("measured now") == std::string::npos);
  CHECK(!src[0].empty());
  // a collective two_level has no form for is an error, as any policy's
  const collx_test::scoped_env e("COLLX_ALGO", "all_to_all=two_level");
  CHECK_THROWS_WITH(collx::launch_node_threads(lay_out(4, layout::round_robin), policies),
                    Catch::Matchers::Contains("two_level has no all_to_all schedule"));
}

TEST_CASE("transport::any holding a two-level transport: its node map, the levels' model, the node-aware collectives", "[two_level]") {
  // (the torch backend's communicator is a communicator<any>: join_named("two_level", ...))
  std::vector<std::string> ran(5);
  collx::launch_node_threads<collx::transport::as_any>(lay_out(5, layout::uneven), [&](auto& comm) {
    static_assert(std::is_same_v<std::decay_t<decltype(comm.transport())>, collx::transport::any>);
    const int n = comm.size(), r = comm.rank();
    if (comm.transport().nodes().nodes() != 2) throw std::runtime_error("any: no node map");
    if (std::string(comm.transport().level_kinds().first) != "inproc") throw std::runtime_error("any: no levels");
    std::vector<float> v(300007, float(r + 1));
    collx::all_reduce(comm, std::span{v}, collx::ops::sum{});  // automatic: the two-level model
    const float want = float(n * (n + 1) / 2);
    if (v.front() != want || v.back() != want) throw std::runtime_error("any: wrong all_reduce");
    std::vector<float> all(5 * 1001, float(r)), mine(1001);
    collx::reduce_scatter(comm, std::span<const float>{all}, std::span{mine}, collx::ops::sum{}, algo::two_level{});
    if (mine.back() != float(n * (n - 1) / 2)) throw std::runtime_error("any: wrong reduce_scatter");
    if (!comm.automatic().levels) throw std::runtime_error("any: automatic has no levels");
    // a split (torch's new_group): two-level too, its own node map
    auto sub = comm.split(r % 2, r);
    if (sub.transport().nodes().size() != sub.size()) throw std::runtime_error("any: the split has no node map");
    std::vector<int> x(1001, 1);
    collx::all_reduce(sub, std::span{x}, collx::ops::sum{}, algo::two_level{});
    if (x.back() != sub.size()) throw std::runtime_error("any: wrong all_reduce on the split");
    for (const auto& rec : collx::flight::records(comm))
      ran[std::size_t(r)] += std::string(rec.sig.policy, strnlen(rec.sig.policy, sizeof rec.sig.policy)) + " ";
  });
  for (const auto& s : ran) CHECK(s.find("two_level") != std::string::npos);
}

TEST_CASE("over nodes of threads: nonblocking calls and a fused batch (its all-reduces as one, over their own buffers)", "[two_level]") {
  CHECK(collx_test::run_checked<node_threads<layout::uneven>>(5, [](auto& comm, auto note) {
          const int n = comm.size(), r = comm.rank();
          std::vector<std::vector<float>> grads;
          for (std::size_t k : {std::size_t(1), std::size_t(7), std::size_t(4099), std::size_t(300007)}) grads.emplace_back(k, float(r + 1));
          collx::fused f(comm);
          for (auto& g : grads) f.all_reduce(std::span{g}, collx::ops::sum{});
          f.run();
          const float want = float(n * (n + 1) / 2);
          for (const auto& g : grads)
            if (g.front() != want || g.back() != want) note("fused: got " + std::to_string(g.back()) + ", want " + std::to_string(want));
          std::vector<double> a(100003, double(r));
          auto w = collx::async::all_reduce(comm, std::span{a}, collx::ops::max{});
          w.wait();
          if (a[100002] != double(n - 1)) note("async all_reduce: got " + std::to_string(a[100002]));
        }) == "");
}

TEST_CASE("over nodes of threads: all_to_all_v, send/recv and recv_any across and within nodes, split", "[two_level]") {
  for (int n : {2, 3, 5}) {
    CAPTURE(n);
    CHECK(collx_test::run_all_to_all_v<node_threads<layout::round_robin>>(n) == "");
  }
  // recv_any from peers on both levels: rank 0 (node 0 of {0, 2, 4} | {1, 3}) takes one message
  // from each other rank, in whatever order they come.
  CHECK(collx_test::run_checked<node_threads<layout::round_robin>>(5, [](auto& comm, auto note) {
          const int r = comm.rank();
          if (r == 0) {
            std::vector<int> from{1, 2, 3, 4}, got;
            for (int k = 0; k < 4; ++k) {
              int v = -1;
              const int src = collx::recv_any(comm, std::span{&v, 1}, std::span<const int>{from});
              if (v != src * 10) note("from rank " + std::to_string(src) + " got " + std::to_string(v));
              got.push_back(src);
              from.erase(std::find(from.begin(), from.end(), src));
            }
            std::sort(got.begin(), got.end());
            if (got != std::vector<int>{1, 2, 3, 4}) note("recv_any did not take one message from each rank");
          } else {
            const int v = r * 10;
            collx::send(comm, std::span{&v, 1}, 0);
          }
        }) == "");
  // A split of a two-level communicator is one: its nodes are its members' nodes.
  CHECK(collx_test::run_checked<node_threads<layout::uneven>>(7, [](auto& comm, auto note) {
          auto sub = comm.split(comm.rank() % 2, comm.rank());
          const int n = sub.size();
          std::vector<float> v(1001, float(comm.rank()));
          collx::all_reduce(sub, std::span{v}, collx::ops::sum{}, algo::two_level{});
          float want = 0;
          for (int r = comm.rank() % 2; r < 7; r += 2) want += float(r);
          if (v[1000] != want) note("the split's all_reduce: got " + std::to_string(v[1000]) + ", want " + std::to_string(want));
          const auto& nm = sub.transport().nodes();
          if (nm.size() != n) note("the split's node map has " + std::to_string(nm.size()) + " ranks");
        }) == "");
}

TEST_CASE("over nodes of threads: a late rank is named by its rank here, not its place on its node", "[two_level][errors]") {
  // Nodes {0, 2, 4} and {1, 3}: rank 2 is local rank 1 of node 0; it never calls, and rank 0
  // waits for it on the node's transport (the node's sum: recursive doubling, rank 2 first).
  collx::options o;
  o.timeout = std::chrono::milliseconds(500);
  std::vector<std::string> what(5);
  try {
    collx::launch_node_threads(
        lay_out(5, layout::round_robin),
        [&](auto& comm) {
          std::vector<float> v(64, 1.f);
          try {
            if (comm.rank() != 2) collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::two_level{});
            else std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          } catch (const collx::error& e) {
            what[std::size_t(comm.rank())] = e.what();
            throw;
          }
        },
        o);
  } catch (const collx::error&) {
  }
  const std::string& w = what[0];
  INFO(w);
  // (rank 0 times out, or another rank that waits for rank 2 times out first and aborts the job)
  CHECK(w.find("all_reduce #1 (two_level): rank 0 ") != std::string::npos);
  CHECK(w.find("waiting for rank 2 (") != std::string::npos);
  CHECK(w.find("rank 1 (") == std::string::npos);
  // the desync report, ranks here: rank 2 never called (its position is not another's)
  CHECK(w.find("rank 2 is in no collective yet") != std::string::npos);
  CHECK(w.find("rank 2 is blocked") == std::string::npos);
}

TEST_CASE("over nodes of processes (shm within, tcp across, the map gathered from COLLX_NODE)", "[two_level][processes]") {
  for (int n : {2, 3, 4, 5}) {
    CAPTURE(n);
    CHECK(collx_test::run_all_reduce<float, collx::ops::sum, algo::two_level, node_processes<layout::pairs>>(n, 100003, false) == "");
    CHECK(collx_test::run_all_reduce<std::int32_t, collx::ops::sum, algo::two_level, node_processes<layout::round_robin>>(n, 1, true) == "");
    CHECK(collx_test::run_all_reduce<float, collx::ops::sum, algo::ring, node_processes<layout::round_robin>>(n, 100003, true) == "");
    CHECK(collx_test::run_all_reduce<float, collx::ops::sum, algo::automatic, node_processes<layout::uneven>>(n, 4099, false) == "");
  }
  CHECK(collx_test::run_checked<node_processes<layout::uneven>>(5, [](auto& comm, auto note) {
          const auto& nm = comm.transport().nodes();
          if (nm.describe() != "node 0: ranks 0, 1, 2; node 1: ranks 3, 4") note("node map: " + nm.describe());
          if (comm.transport().intra().size() != (comm.rank() < 3 ? 3 : 2)) note("the node's transport has the wrong size");
        }) == "");
}

TEST_CASE("the machine: NUMA domains from sysfs, placement of local ranks, pinning, COLLX_TOPO_DUMP", "[two_level][topology]") {
  // This machine: every domain's CPUs are online ones, every online CPU in a domain, this
  // process's allowed CPUs among them.
  const collx::machine m = collx::read_machine();
  REQUIRE(!m.numa.empty());
  std::vector<int> all;
  for (const auto& d : m.numa) all.insert(all.end(), d.cpus.begin(), d.cpus.end());
  std::sort(all.begin(), all.end());
  CHECK(all == m.online);
  for (int c : m.allowed) CHECK(std::find(m.online.begin(), m.online.end(), c) != m.online.end());
  // A sysfs of two domains, as a machine of two sockets has it.
  const auto root = std::filesystem::temp_directory_path() / ("collx-sysfs-" + std::to_string(::getpid()));
  std::filesystem::create_directories(root / "cpu");
  for (int d : {0, 1}) std::filesystem::create_directories(root / "node" / ("node" + std::to_string(d)));
  auto put = [&](const std::filesystem::path& p, const std::string& s) { std::ofstream(p) << s; };
  put(root / "cpu/online", "0-7\n");
  put(root / "node/online", "0-1\n");
  put(root / "node/node0/cpulist", "0-3\n");
  put(root / "node/node1/cpulist", "4-5,6,7\n");
  put(root / "node/node0/meminfo", "Node 0 MemTotal:       1024 kB\nNode 0 MemFree: 5 kB\n");
  put(root / "node/node1/meminfo", "Node 1 MemTotal:       2048 kB\n");
  const collx::machine two = collx::read_machine(root.string());
  std::filesystem::remove_all(root);
  REQUIRE(two.numa.size() == 2);
  CHECK(two.numa[1].cpus == std::vector<int>{4, 5, 6, 7});
  CHECK(two.numa[0].memory_bytes == 1024 * 1024);
  CHECK(two.online.size() == 8);
  CHECK(collx::detail_machine::format_list(two.numa[1].cpus) == "4-7");
  CHECK(collx::detail_machine::format_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  // local rank l of L goes to domain l*D/L: consecutive local ranks share a domain
  for (const auto& [L, want] : std::vector<std::pair<int, std::vector<int>>>{{1, {0}}, {2, {0, 1}}, {3, {0, 0, 1}}, {4, {0, 0, 1, 1}}}) {
    std::vector<int> got;
    for (int l = 0; l < L; ++l) got.push_back(two.domain_of(l, L));
    CHECK(got == want);
  }
  // Pinned to a domain, a process reads itself as pinned (and two_level then leaves it there).
  if (m.online.size() > 1) {
    collx::machine one = m;
    one.numa = {{0, {m.online.front()}, 0}, {1, std::vector<int>(m.online.begin() + 1, m.online.end()), 0}};
    const pid_t child = ::fork();
    if (child == 0) {
      const bool ok = collx::pin_to_domain(one, 0) && collx::read_machine().pinned() &&
                      collx::read_machine().allowed == std::vector<int>{m.online.front()};
      ::_exit(ok ? 0 : 1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  // COLLX_TOPO_DUMP: rank 0 writes the job's nodes, their ranks, each node's machine and the
  // transports of the two levels.
  const auto file = std::filesystem::temp_directory_path() / ("collx-topo-" + std::to_string(::getpid()) + ".json");
  {
    const collx_test::scoped_env e("COLLX_TOPO_DUMP", file.string().c_str());
    CHECK(collx_test::run_checked<node_processes<layout::uneven>>(5, [](auto&, auto) {}) == "");
  }
  std::ifstream f(file);
  const std::string js((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::filesystem::remove(file);
  CHECK(js.find("\"ranks\": 5, \"within\": \"shm\", \"between\": \"tcp\"") != std::string::npos);
  CHECK(js.find("{\"node\": 0, \"ranks\": [0, 1, 2], \"machine\": {\"host\": ") != std::string::npos);
  CHECK(js.find("{\"node\": 1, \"ranks\": [3, 4], \"machine\": {\"host\": ") != std::string::npos);
  CHECK(js.find("\"numa\": [{\"id\": " + std::to_string(m.numa.front().id) + ", \"cpus\": \"" +
                collx::detail_machine::format_list(m.numa.front().cpus) + "\"") != std::string::npos);
}
