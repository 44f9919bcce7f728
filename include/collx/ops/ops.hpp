#pragma once
// The built-in reduction functors. Each is a template over the element type, tagged as a
// reduction op, and says whether it is commutative. Arithmetic on half/bfloat16 widens to float
// through their conversion operators and rounds once when the result is stored back.
#include <type_traits>
#include <utility>

#include "../core/concepts.hpp"
#include "../core/types.hpp"

namespace collx::ops {

struct sum {
  using reduction_op_concept = reduction_op_tag;
  static constexpr const char* name = "sum";
  template <class T>
  constexpr T operator()(const T& a, const T& b) const {
    if constexpr (is_reduced_float_v<T>) return T(float(a) + float(b));
    else return T(a + b);
  }
};

struct prod {
  using reduction_op_concept = reduction_op_tag;
  static constexpr const char* name = "prod";
  template <class T>
  constexpr T operator()(const T& a, const T& b) const {
    if constexpr (is_reduced_float_v<T>) return T(float(a) * float(b));
    else return T(a * b);
  }
};

struct min {
  using reduction_op_concept = reduction_op_tag;
  static constexpr const char* name = "min";
  template <class T>
  constexpr T operator()(const T& a, const T& b) const {
    if constexpr (is_reduced_float_v<T>) return float(b) < float(a) ? b : a;
    else return b < a ? b : a;
  }
};

struct max {
  using reduction_op_concept = reduction_op_tag;
  static constexpr const char* name = "max";
  template <class T>
  constexpr T operator()(const T& a, const T& b) const {
    if constexpr (is_reduced_float_v<T>) return float(a) < float(b) ? b : a;
    else return a < b ? b : a;
  }
};

/// Average: reduces like sum; the owner of each reduced element divides by the rank count once at
/// the end (integer division for integers).
struct avg : sum {
  static constexpr const char* name = "avg";
  template <class T>
  static constexpr T finalize(const T& x, int n) {
    if constexpr (is_reduced_float_v<T>) return T(float(x) / float(n));
    else if constexpr (std::is_integral_v<T>) {
      // In the widest type of T's signedness: n itself may not fit T (uint8_t(256) == 0, a
      // division by zero at 256 ranks; int8_t(200) < 0).
      using W = std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>;
      return T(W(x) / W(n));
    } else return T(x / static_cast<T>(n));
  }
};

/// PREMUL_SUM (torch's ReduceOp.PREMUL_SUM, NCCL's ncclRedOpCreatePreMulSum): the sum of every
/// rank's input times that rank's own factor, f_0·x_0 + f_1·x_1 + ... (DDP scales its gradients
/// so). Each rank scales its own contribution once as the call starts (`prescale`: the reducing
/// collectives apply it, host memory only), then the call sums. Floating element types only:
/// float and double scale in their own type, half and bfloat16 in float, rounded once.
struct premul_sum : sum {
  static constexpr const char* name = "premul_sum";
  double factor = 1.0;
  constexpr premul_sum() = default;
  constexpr explicit premul_sum(double f) : factor(f) {}
  template <class T>
  constexpr T prescale(const T& x) const {
    static_assert(std::is_floating_point_v<T> || is_reduced_float_v<T>,
                  "collx: ops::premul_sum scales floating-point elements only (float, double, half, bfloat16)");
    if constexpr (is_reduced_float_v<T>) return T(float(x) * float(factor));
    else return T(x * T(factor));
  }
};

/// Op (sum by default; prod, avg, premul_sum) accumulated in A: where the deterministic mode
/// reduces (algo/deterministic.hpp), every element's N contributions are converted to A, reduced
/// there in rank order, and rounded to the element type once. `ops::accumulate_in<float>{}` sums
/// half or bfloat16 in float (their default already), `ops::accumulate_in<double>{}` sums float
/// in double. Elsewhere it reduces as Op does: a policy's step rounds each partial result to the
/// element type it sends (docs/precision.md).
template <class A, class Op = sum>
struct accumulate_in : Op {
  static_assert(std::is_floating_point_v<A>, "collx: ops::accumulate_in<A>: A is float or double (the accumulator of a floating sum)");
  using accumulator = A;
  using Op::Op;
  constexpr accumulate_in() = default;
  constexpr explicit accumulate_in(Op o) : Op(o) {}
};

struct band {
  using reduction_op_concept = reduction_op_tag;
  static constexpr const char* name = "band";
  template <class T> requires std::is_integral_v<T>
  constexpr T operator()(T a, T b) const { return T(a & b); }
};

struct bor {
  using reduction_op_concept = reduction_op_tag;
  static constexpr const char* name = "bor";
  template <class T> requires std::is_integral_v<T>
  constexpr T operator()(T a, T b) const { return T(a | b); }
};

struct bxor {
  using reduction_op_concept = reduction_op_tag;
  static constexpr const char* name = "bxor";
  template <class T> requires std::is_integral_v<T>
  constexpr T operator()(T a, T b) const { return T(a ^ b); }
};

/// Wraps any callable E(E, E) as a reduction op; Commutative=false makes every policy keep rank
/// order (in0 ⊕ in1 ⊕ ... ⊕ in(n-1)) or refuse to compile.
template <class F, bool Commutative>
struct function {
  using reduction_op_concept = reduction_op_tag;
  static constexpr bool commutative = Commutative;
  F f;
  template <class T>
  constexpr T operator()(const T& a, const T& b) const { return f(a, b); }
};

/// Whether a wrapped callable's order of operands matters: ops::make takes one of these, so the
/// choice is always written down. A non-commutative op gets the rank-ordered result (tree,
/// recursive_halving, recursive_doubling, automatic) and the ring refuses it at compile time;
/// a commutative one may be combined in any order, which is only right when a ⊕ b == b ⊕ a.
struct commutative_t {
  static constexpr bool value = true;
};
struct non_commutative_t {
  static constexpr bool value = false;
};
inline constexpr commutative_t commutative{};
inline constexpr non_commutative_t non_commutative{};

template <class F, class C>
  requires(std::is_same_v<C, commutative_t> || std::is_same_v<C, non_commutative_t>)
constexpr function<std::decay_t<F>, C::value> make(F&& f, C) {
  return {std::forward<F>(f)};
}

/// Without the second argument: a readable error, not a silent guess.
template <class F>
constexpr void make(F&&) {
  static_assert(sizeof(F) == 0,
                "collx: say whether the op is commutative: collx::ops::make(f, collx::ops::commutative) or "
                "collx::ops::make(f, collx::ops::non_commutative) (a non-commutative op gets the rank-ordered result)");
}

}  // namespace collx::ops

namespace collx {
namespace detail {
template <class Op>
inline constexpr bool is_user_op_v = false;
template <class F, bool C>
inline constexpr bool is_user_op_v<ops::function<F, C>> = true;
template <class Op, class E>
constexpr auto accumulator_pick() {
  if constexpr (requires { typename Op::accumulator; }) return std::type_identity<typename Op::accumulator>{};
  else if constexpr (is_user_op_v<Op>) return std::type_identity<E>{};  // (a user's op takes its own element type)
  else return std::type_identity<compute_type_t<E>>{};
}
}  // namespace detail
/// The type a fold (core/schedule.hpp: fold_op) reduces in: Op::accumulator where the op names
/// one (ops::accumulate_in), float for half and bfloat16 under the built-in ops, else the
/// element type itself (a user's op always).
template <class Op, class E>
using accumulator_t = typename decltype(detail::accumulator_pick<Op, E>())::type;

/// True when a reduction with Op may give other bits in another order: sums, products and
/// averages of floating-point elements, and a user's op (ops::make) over any type; never min,
/// max or a bitwise op, nor integer arithmetic (exact modulo 2^bits in any order). What
/// options::deterministic turns to algo::deterministic.
template <class Op, class E>
inline constexpr bool order_shows_v =
    !std::is_same_v<Op, ops::min> && !std::is_same_v<Op, ops::max> && !std::is_same_v<Op, ops::band> &&
    !std::is_same_v<Op, ops::bor> && !std::is_same_v<Op, ops::bxor> &&
    (std::is_floating_point_v<E> || is_reduced_float_v<E> || (!std::is_base_of_v<ops::sum, Op> && !std::is_same_v<Op, ops::prod>));

/// True when Op divides at the end (avg).
template <class Op, class E>
inline constexpr bool has_finalize_v = requires(const E& x) { Op::finalize(x, 1); };
/// True when reducing two contributions at a time, each result rounded to E, gives the bits of a
/// fold that reduces them all in the accumulator (ops::fold_into): the accumulator is E itself
/// and nothing is applied at the end. Then the deterministic mode may reduce each contribution as
/// it arrives, in rank order, instead of landing them all and folding (algo/deterministic.hpp).
template <class Op, class E>
inline constexpr bool stepwise_exact_v = std::is_same_v<accumulator_t<Op, E>, E> && !has_finalize_v<Op, E>;
/// An op that scales each rank's own contribution before the reduction (ops::premul_sum).
template <class Op, class E>
inline constexpr bool has_prescale_v = requires(const Op& op, const E& x) { op.prescale(x); };
}  // namespace collx
