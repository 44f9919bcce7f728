#pragma once
// The three concepts collx is built from. A type opts in with a tag member, so nothing matches by
// accident (the stdexec way):
//   struct my_transport { using transport_concept = collx::transport_tag; ... };
//   struct my_policy    { using algorithm_policy_concept = collx::algorithm_policy_tag; ... };
//   struct my_op        { using reduction_op_concept = collx::reduction_op_tag; E operator()(E, E) const; };
// Each check_* below turns a failed concept into a static_assert that names what is missing.
#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "schedule.hpp"

namespace collx {

struct transport_tag {};
struct algorithm_policy_tag {};
struct reduction_op_tag {};

/// Where a transport's buffers live. Host transports use host_memory, and the executor runs each
/// step of a schedule through their exchange(). A transport may instead take whole schedules:
///   template <class E, class Op>
///   void run_schedule(const call_info&, const schedule&, const E* in, E* out, const Op&)
/// runs every step of one rank's schedule (its own scratch, its own way of moving data: a device
/// transport lowers it to a plan one kernel walks, device/plan.hpp). A transport whose memory is
/// not host memory must take whole schedules and supply the two local operations the executor
/// would otherwise do on the host (collectives/executor.hpp checks that it does, by name, so a misspelt hook
/// is a compile error and never a memmove on device pointers):
///   void copy_local(std::span<const local_copy_part> parts)    (every part, done on return: a
///                                                                device transport enqueues them all
///                                                                and waits once)
///   void finalize<E, Op>(E* p, std::size_t count, int ranks)   (avg's division)
///   std::byte* host_staging(std::size_t bytes), copy_from_host(dst, src, bytes),
///   copy_to_host(dst, src, bytes)                              (the library's own calls on host
///                                                                memory: collectives/executor.hpp,
///                                                                on_transport_memory)
/// Policies never see memory: they only produce schedules of regions.
struct host_memory {};

/// One copy within a rank's own memory (of its transport's space), for copy_local.
struct local_copy_part {
  std::byte* dst;
  const std::byte* src;
  std::size_t bytes;
};

/// Marker for collectives that reduce nothing.
struct no_op {};

// ---- what a transport exchanges -------------------------------------------------------------

/// Type-erased reduction over raw memory: dst[i] = left[i] ⊕ right[i] for n elements. dst may
/// equal left or right (in-place accumulation); other overlap is not allowed.
struct combiner {
  void (*fn)(const void* op, void* dst, const void* left, const void* right, std::size_t n) = nullptr;
  const void* op = nullptr;
  std::size_t elem_size = 1;
  void operator()(void* dst, const void* left, const void* right, std::size_t n) const { fn(op, dst, left, right, n); }
};

/// A buffer made of several buffers one after another: a fused batch's parts (features/fuse.hpp), so its
/// all-reduces run as one schedule over the user's own memory, with no packing copy. Byte b of
/// the whole lies at base[k] + (b - at[k]) for the part k with at[k] <= b < at[k + 1]; every part
/// is a whole number of elements.
struct pieces {
  std::vector<std::size_t> at;   // parts + 1 offsets, at[0] = 0, at.back() = the total
  std::vector<std::byte*> base;  // one per part
  /// Where byte b is, shortening len to what follows it in its part. `k` is a hint, the part of
  /// the previous lookup: runs are read in order, so the next part is found by stepping on.
  std::byte* locate(std::size_t b, std::size_t& len, std::size_t& k) const {
    if (k >= at.size() - 1 || b < at[k]) k = std::size_t(std::upper_bound(at.begin(), at.end(), b) - at.begin()) - 1;
    while (at[k + 1] <= b) ++k;
    len = std::min(len, at[k + 1] - b);
    return base[k] + (b - at[k]);
  }
};

/// An operand of a message: `p`, or, when `of` is set, bytes from `at` on of a pieces buffer.
/// Transports reach a spread operand only through core/deliver.hpp (gather, deliver, runs)
/// and say that they do with `bool takes_pieces() const` (features/fuse.hpp packs for the others).
struct operand {
  const pieces* of = nullptr;
  std::size_t at = 0;
};

namespace detail {
/// Whether transport t moves spread operands (else a fused batch packs them: features/fuse.hpp).
template <class T>
bool takes_pieces(const T& t) noexcept {
  if constexpr (requires { t.takes_pieces(); }) return t.takes_pieces();
  else return false;
}
}  // namespace detail

struct send_desc {
  int peer;
  const std::byte* data;  // nullptr when spread
  std::size_t bytes;
  operand spread{};
};

struct recv_desc {
  int peer;
  std::byte* dst;  // nullptr when spread
  std::size_t bytes;
  const std::byte* with;  // the local operand, or nullptr for a plain copy (or when spread)
  combine how;
  operand dst_spread{}, with_spread{};
  bool spread() const noexcept { return dst_spread.of != nullptr || with_spread.of != nullptr; }
};

/// Whether receive `later` reduces into memory that receive `earlier` writes (a tree node
/// summing two children into one accumulator; the deterministic mode's chain in rank order):
/// then `later` waits for `earlier`. Spread operands overlap by their places in the one pieces
/// buffer (a plain operand is scratch then, never part of it).
inline bool reads_what_writes(const recv_desc& later, const recv_desc& earlier) noexcept {
  if (later.with != nullptr && earlier.dst < later.with + later.bytes && later.with < earlier.dst + earlier.bytes) return true;
  if (const operand& w = later.with_spread; w.of != nullptr && later.how != combine::copy) {
    const operand& d = earlier.dst_spread;
    return d.of == w.of && d.at < w.at + later.bytes && w.at < d.at + earlier.bytes;
  }
  return false;
}

/// The order rule every transport's progress loop obeys (core/schedule.hpp): messages to or from one
/// peer share a stream, so only the first unfinished one per peer may move; and a receive that
/// reduces into what an earlier receive of the step writes waits for it (reads_what_writes).
/// `st[j].done` says whether operation j has finished.
template <class Op, class State>
bool may_progress(std::span<const Op> ops, const State& st, std::size_t i) {
  for (std::size_t j = 0; j < i; ++j)
    if (!st[j].done && ops[j].peer == ops[i].peer) return false;
  if constexpr (std::is_same_v<Op, recv_desc>) {
    if (ops[i].with != nullptr || ops[i].with_spread.of != nullptr)
      for (std::size_t j = 0; j < i; ++j)
        if (!st[j].done && reads_what_writes(ops[i], ops[j])) return false;
  }
  return true;
}

struct call_info;  // core/call_info.hpp

/// What a transport needs to run one step: the call (for matching and for error messages), how
/// to reduce, and the deadline for each wait (in the call). `synchronous`: a send is done only
/// once its receiver has taken the message (point-to-point calls, collectives/p2p.hpp); else a
/// transport may finish a send as soon as the message is on its way (buffered, eager).
struct exchange_context {
  const call_info* call;
  combiner comb;
  bool synchronous = false;
};

// ---- Transport ------------------------------------------------------------------------------

/// Whether T takes whole schedules (run_schedule, above) instead of one step at a time.
template <class T>
concept RunsSchedules = requires(T& t, const call_info& c, const schedule& s, const std::byte* in, std::byte* out) {
  t.template run_schedule<std::byte>(c, s, in, out, no_op{});
};

template <class T>
concept Transport = requires { typename T::transport_concept; } &&
                    std::same_as<typename T::transport_concept, transport_tag> &&
                    requires(T& t, const T& ct, const std::string& why) {
                      typename T::memory_space;
                      { ct.rank() } -> std::convertible_to<int>;
                      { ct.size() } -> std::convertible_to<int>;
                      t.abort(why);  // poison the communicator after a failure on this rank
                    } &&
                    (RunsSchedules<T> ||
                     requires(T& t, std::span<const send_desc> s, std::span<const recv_desc> r, const exchange_context& ctx) {
                       t.exchange(s, r, ctx);  // run one step: post the sends, serve the receives, wait
                     });

template <class T>
constexpr bool check_transport() {
  static_assert(requires { typename T::transport_concept; },
                "collx: not a transport: add `using transport_concept = collx::transport_tag;` to the type");
  if constexpr (requires { typename T::transport_concept; }) {
    static_assert(std::same_as<typename T::transport_concept, transport_tag>,
                  "collx: transport_concept must be collx::transport_tag");
    static_assert(requires { typename T::memory_space; },
                  "collx: a transport must name its memory_space (collx::host_memory for host buffers)");
    static_assert(requires(const T& t) { { t.rank() } -> std::convertible_to<int>; },
                  "collx: a transport needs `int rank() const`");
    static_assert(requires(const T& t) { { t.size() } -> std::convertible_to<int>; },
                  "collx: a transport needs `int size() const`");
    static_assert(RunsSchedules<T> ||
                      requires(T& t, std::span<const send_desc> s, std::span<const recv_desc> r, const exchange_context& c) {
                        t.exchange(s, r, c);
                      },
                  "collx: a transport needs `void exchange(span<const send_desc>, span<const recv_desc>, "
                  "const exchange_context&)`, or `template <class E, class Op> void run_schedule(const call_info&, "
                  "const schedule&, const E* in, E* out, const Op&)`");
    if constexpr (requires { typename T::memory_space; }) {
      if constexpr (!std::same_as<typename T::memory_space, host_memory>) {
        static_assert(RunsSchedules<T>,
                      "collx: a transport whose memory_space is not host_memory must take whole schedules: "
                      "`template <class E, class Op> void run_schedule(const call_info&, const schedule&, const E*, E*, const Op&)`");
        static_assert(requires(T& t, std::span<const local_copy_part> parts) { t.copy_local(parts); },
                      "collx: a transport whose memory_space is not host_memory needs "
                      "`void copy_local(std::span<const collx::local_copy_part> parts)`");
        static_assert(requires(T& t, float* p, std::size_t n) { t.template finalize<float, no_op>(p, n, 1); },
                      "collx: a transport whose memory_space is not host_memory needs "
                      "`template <class E, class Op> void finalize(E* p, std::size_t count, int ranks)`");
        static_assert(requires(T& t, std::byte* d, std::size_t n) {
                        { t.host_staging(n) } -> std::same_as<std::byte*>;
                        t.copy_from_host(d, static_cast<const void*>(d), n);
                        t.copy_to_host(static_cast<void*>(d), static_cast<const std::byte*>(d), n);
                      },
                      "collx: a transport whose memory_space is not host_memory needs `std::byte* host_staging(std::size_t)`, "
                      "`void copy_from_host(std::byte*, const void*, std::size_t)` and `void copy_to_host(void*, const std::byte*, "
                      "std::size_t)`: the library's own calls on host memory (split's agreement) run on a copy in its memory");
      }
    }
    static_assert(requires(T& t, const std::string& w) { t.abort(w); },
                  "collx: a transport needs `void abort(const std::string&)`");
  }
  return true;
}

// ---- AlgorithmPolicy ------------------------------------------------------------------------

/// A composed policy's name as a constant, its parts joined: policy_name("deterministic(",
/// Inner::name, ")").data() is "deterministic(ring)" (47 characters at most).
template <class... S>
constexpr std::array<char, 48> policy_name(const S&... parts) {
  std::array<char, 48> b{};
  std::size_t at = 0;
  for (const char* p : {static_cast<const char*>(parts)...})
    for (; *p != '\0' && at + 1 < b.size(); ++p) b[at++] = *p;
  return b;
}

template <class A>
concept AlgorithmPolicy = requires { typename A::algorithm_policy_concept; } &&
                          std::same_as<typename A::algorithm_policy_concept, algorithm_policy_tag> &&
                          requires { { A::name } -> std::convertible_to<const char*>; };

template <class A>
constexpr bool check_policy() {
  static_assert(requires { typename A::algorithm_policy_concept; },
                "collx: not an algorithm policy: pass collx::algo::ring{}, tree{}, recursive_halving{}, "
                "pairwise{} or automatic{}, or add `using algorithm_policy_concept = collx::algorithm_policy_tag;`");
  if constexpr (requires { typename A::algorithm_policy_concept; }) {
    static_assert(std::same_as<typename A::algorithm_policy_concept, algorithm_policy_tag>,
                  "collx: algorithm_policy_concept must be collx::algorithm_policy_tag");
    static_assert(requires { { A::name } -> std::convertible_to<const char*>; },
                  "collx: an algorithm policy needs `static constexpr const char* name`");
  }
  return true;
}

// ---- ReductionOp ----------------------------------------------------------------------------

template <class Op, class E>
concept ReductionOp = requires { typename Op::reduction_op_concept; } &&
                      std::same_as<typename Op::reduction_op_concept, reduction_op_tag> &&
                      std::is_trivially_copyable_v<E> && std::is_invocable_r_v<E, const Op&, E, E>;

template <class Op, class E>
constexpr bool check_op() {
  static_assert(std::is_trivially_copyable_v<E>, "collx: element types must be trivially copyable");
  static_assert(requires { typename Op::reduction_op_concept; },
                "collx: not a reduction op: add `using reduction_op_concept = collx::reduction_op_tag;` to the "
                "functor, or wrap a lambda with collx::ops::make(f, collx::ops::commutative) (or ops::non_commutative)");
  if constexpr (requires { typename Op::reduction_op_concept; }) {
    static_assert(std::same_as<typename Op::reduction_op_concept, reduction_op_tag>,
                  "collx: reduction_op_concept must be collx::reduction_op_tag");
    static_assert(std::is_invocable_r_v<E, const Op&, E, E>,
                  "collx: this op cannot reduce this element type: it needs `E operator()(E, E) const` "
                  "(bitwise ops take integer types only)");
  }
  return true;
}

/// A functor is commutative unless it says otherwise with `static constexpr bool commutative = false;`.
template <class Op>
constexpr bool is_commutative_v = [] {
  if constexpr (requires { Op::commutative; }) return bool(Op::commutative);
  else return true;
}();

}  // namespace collx
