// Schedules checked as data, for many more rank counts than the threaded runs can afford: every
// send meets its receive in the same step, no step overwrites what it is sending, and the step
// counts on the critical path are the ones docs/algorithms.md derives.
#include <catch2/catch.hpp>

#include "schedules.hpp"

using namespace collx_test;
namespace algo = collx::algo;

TEMPLATE_TEST_CASE("every schedule is consistent across ranks", "[schedule]", algo::ring, algo::tree,
                   algo::recursive_halving, algo::recursive_doubling, algo::pairwise) {
  const TestType a{};
  for (int n = 1; n <= 33; ++n)
    for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(n + 1), std::size_t(1000003)})
      for (coll c : {coll::all_reduce, coll::reduce_scatter, coll::all_gather, coll::broadcast, coll::reduce,
                     coll::all_to_all})
        for (int root : {0, n / 3, n - 1})
          for (bool commutative : {true, false}) {
            if (!commutative && !TestType::keeps_rank_order) continue;
            const auto s = schedules(a, c, n, count, root, commutative);
            if (s.empty()) continue;
            CAPTURE(n, count, name(c), root, commutative);
            CHECK(check_consistent(s) == "");
          }
}

TEST_CASE("steps on the critical path match the derivations", "[schedule][cost]") {
  for (int n = 2; n <= 33; ++n) {
    CAPTURE(n);
    const std::size_t big = std::size_t(n) * 1000;
    const int lg = algo::ceil_log2(n);
    const bool pow2 = (n & (n - 1)) == 0;
    const int p = algo::floor_pow2(n), extra = pow2 ? 0 : 2, lgp = algo::ceil_log2(p);
    CHECK(span(schedules(algo::ring{}, coll::all_reduce, n, big)) == 2 * (n - 1));
    CHECK(span(schedules(algo::ring{}, coll::reduce_scatter, n, big)) == n - 1);
    CHECK(span(schedules(algo::ring{}, coll::all_gather, n, big)) == n - 1);
    CHECK(span(schedules(algo::recursive_halving{}, coll::reduce_scatter, n, big)) == lgp + extra);
    CHECK(span(schedules(algo::recursive_halving{}, coll::all_gather, n, big)) == lgp + extra);
    CHECK(span(schedules(algo::recursive_halving{}, coll::all_reduce, n, big)) == 2 * (lgp + extra));
    CHECK(span(schedules(algo::tree{}, coll::broadcast, n, big, n / 2)) == lg);
    CHECK(span(schedules(algo::tree{}, coll::reduce, n, big, n / 2)) == lg);
    // all_to_all: N-1 steps for blocks above tuning::a2a_one_step_bytes, one step up to it.
    const std::size_t a2a_big = algo::tuning::a2a_one_step_bytes / 4 + 1;
    CHECK(span(schedules(algo::pairwise{}, coll::all_to_all, n, a2a_big)) == n - 1);
    CHECK(span(schedules(algo::pairwise{}, coll::all_to_all, n, a2a_big - 1)) == 1);
    CHECK(span(schedules(algo::pairwise{}, coll::all_gather, n, a2a_big)) == n - 1);
    CHECK(span(schedules(algo::pairwise{}, coll::all_gather, n, a2a_big - 1)) == 1);
    CHECK(span(schedules(algo::recursive_doubling{}, coll::all_reduce, n, big)) == lgp + extra);
    // The double binary tree, one chunk: up the in-order tree and down again. Its height is
    // ceil(log2 n) (rank 0, the root, has a single child: the top of a complete tree below it).
    const std::size_t one_chunk = 16;
    CHECK(span(schedules(algo::tree{}, coll::all_reduce, n, one_chunk)) == 2 * lg);
    // van de Geijn's broadcast: a binomial scatter, then the recursive-doubling all-gather.
    CHECK(span(schedules(algo::recursive_halving{}, coll::broadcast, n, big, n / 2)) == lg + lgp + extra);
    // A pipelined chain: C chunks cross N-1 hops in C + N - 2 steps.
    const algo::ring chained{.chunk_bytes = 4000};
    const std::size_t chunks = (big * 4 + 3999) / 4000;
    CHECK(span(schedules(chained, coll::broadcast, n, big, 1)) == int(chunks) + n - 2);
    CHECK(span(schedules(chained, coll::reduce, n, big, n - 1)) == int(chunks) + n - 2);
  }
}

TEST_CASE("the in-order binary trees are trees, and the double tree makes each rank interior at most once",
          "[schedule][tree]") {
  for (int n = 1; n <= 64; ++n) {
    CAPTURE(n);
    for (int t : {0, 1}) {
      int roots = 0;
      std::vector<int> parent_seen(static_cast<std::size_t>(n), 0);
      for (int r = 0; r < n; ++r) {
        const auto l = algo::dtree(n, r, t);
        if (l.parent < 0) ++roots;
        for (int c : l.child)
          if (c >= 0) {
            REQUIRE(c < n);
            CHECK(algo::dtree(n, c, t).parent == r);
            ++parent_seen[std::size_t(c)];
          }
      }
      CHECK(roots == 1);
      for (int r = 0; r < n; ++r) CHECK(parent_seen[std::size_t(r)] == (algo::dtree(n, r, t).parent >= 0 ? 1 : 0));
    }
    if (n > 2) {
      for (int r = 0; r < n; ++r) {
        auto interior = [&](int t) {
          const auto l = algo::dtree(n, r, t);
          return l.child[0] >= 0 || l.child[1] >= 0;
        };
        CAPTURE(r);
        // NCCL's construction: an even rank is interior in tree A and a leaf in tree B; for odd n
        // the shift leaves rank 0 interior in both.
        CHECK((!(interior(0) && interior(1)) || (n % 2 == 1 && r == 0)));
      }
    }
  }
}

TEST_CASE("describe() prints a schedule", "[schedule]") {
  const auto s = algo::ring{}.reduce_scatter({1, 4, collx::partition(8, 4), collx::buf::in, collx::buf::none, 4});
  const std::string d = collx::describe(s);
  CHECK(d.find("t0: send in[0+2] -> rank 2") != std::string::npos);
  CHECK(d.find("recv rank 0 -> tmp[0+2] = recv (+) in[6+2]") != std::string::npos);
}

TEST_CASE("chunk counts stay bounded and positive for any chunk_bytes and count", "[schedule][overflow]") {
  namespace tuning = collx::algo::tuning;
  // before: int(count / per) went negative for 2^40 one-byte chunks
  for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(1) << 20, std::size_t(1) << 40, ~std::size_t(0) / 8}) {
    for (std::size_t chunk_bytes : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(256) << 10}) {
      CAPTURE(count, chunk_bytes);
      const collx::partition p = algo::chunks(count, 4, chunk_bytes);
      CHECK(p.parts >= 1);
      CHECK(std::size_t(p.parts) <= tuning::max_pipeline_chunks);
      CHECK(p.end(p.parts - 1) == count);
    }
  }
  // A chain broadcast with 1-byte chunks of a 10 MB buffer: at most max_pipeline_chunks + n steps
  const algo::ring tiny{.chunk_bytes = 1};
  const collx::schedule s = tiny.broadcast({1, 4, 0, std::size_t(10) << 20, 1});
  CHECK(std::size_t(s.span()) <= tuning::max_pipeline_chunks + 4);
  std::size_t covered = 0;
  for (const auto& r : s.recvs()) covered += r.dst.count;
  CHECK(covered == std::size_t(10) << 20);
  const collx::schedule t = algo::tree{.chunk_bytes = 4}.all_reduce({2, 5, std::size_t(1) << 22, 4, true, collx::buf::in});
  CHECK(std::size_t(t.span()) <= tuning::max_pipeline_chunks + 2 * 4);
}

TEST_CASE("a schedule's cache key holds every field of its problem and policy", "[schedules][cache]") {
  // The key is taken field by field (detail::add_fields): each field changed alone changes it.
  // The hand-written keys it replaced left out the partition's part count of all_gather and
  // reduce_scatter problems.
  auto key = [](const auto& pol, const auto& p) {
    collx::detail::schedule_key k{};
    collx::detail::add_fields(k, pol);
    collx::detail::add_fields(k, p);
    return k;
  };
  const collx::algo::rs_problem rs{3, 8, collx::partition(100, 8), collx::buf::in, collx::buf::none, 4, true};
  const auto base = key(collx::algo::ring{}, rs);
  std::vector<collx::algo::rs_problem> changed(7, rs);
  changed[0].rank = 4;
  changed[1].size = 9;
  changed[2].blocks = collx::partition(100, 7);  // the part count alone
  changed[3].src = collx::buf::out;
  changed[4].work = collx::buf::tmp;
  changed[5].elem_size = 8;
  changed[6].commutative = false;
  for (std::size_t i = 0; i < changed.size(); ++i) {
    CAPTURE(i);
    CHECK_FALSE(key(collx::algo::ring{}, changed[i]) == base);
  }
  collx::algo::ring other;
  other.chunk_bytes = 1024;
  CHECK_FALSE(key(other, rs) == base);
  CHECK(key(collx::algo::ring{}, rs) == base);
  const collx::algo::ag_problem ag{1, 4, collx::partition(12, 4), false, 0, 4};
  collx::algo::ag_problem ag2 = ag;
  ag2.blocks = collx::partition(12, 3);
  CHECK_FALSE(key(collx::algo::ring{}, ag) == key(collx::algo::ring{}, ag2));
}
