#pragma once
// Runs one collective on n thread-ranks and compares every rank's result with the serial
// reference. Returns "" when all match, else the first difference. Assertions happen on the
// calling thread (Catch2 is not thread-safe).
#include <collx/collx.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "reference.hpp"

namespace collx_test {

/// How a test starts its ranks: threads of this process, or forked processes over shared memory.
struct threads {
  template <class F>
  void operator()(int n, F&& f) const { collx::launch_threads(n, std::forward<F>(f)); }
};
struct processes {
  template <class F>
  void operator()(int n, F&& f) const { collx::launch_processes(n, std::forward<F>(f)); }
};
/// Processes whose data-moving messages of 1 KiB and more go single copy (process_vm_readv).
struct processes_single_copy {
  template <class F>
  void operator()(int n, F&& f) const {
    collx::transport::shm::config cfg;
    cfg.single_copy_from(1024);
    collx::launch_processes(n, std::forward<F>(f), collx::options{}, cfg);
  }
};

/// Processes over transport::tcp on loopback (rank 0 serves the rendezvous store).
struct processes_tcp {
  template <class F>
  void operator()(int n, F&& f) const { collx::launch_processes(n, std::forward<F>(f), collx::options{}, collx::transport::tcp_config{}); }
};

/// Runs body(comm, note) on n ranks started by L. note(s) records this rank's first problem; a
/// rank with a problem fails at the end of its body (processes report it through
/// launch_processes). Returns "" when every rank is happy, else the first problem or failure.
template <class L, class Body>
std::string run_checked(int n, Body body) {
  failures f(n);
  try {
    L{}(n, [&](auto& comm) {
      const int r = comm.rank();
      body(comm, [&](const std::string& s) { f.note(r, s); });
      if (!f.notes[std::size_t(r)].empty()) throw std::runtime_error("rank " + std::to_string(r) + ": " + f.notes[std::size_t(r)]);
    });
  } catch (const std::exception& e) {
    const std::string first = f.first();
    return first.empty() ? std::string(e.what()) : first;
  }
  return f.first();
}

template <class E>
std::string show(const E& x) {
  std::ostringstream o;
  if constexpr (collx::is_reduced_float_v<E>) o << float(x);
  else if constexpr (std::is_same_v<E, signed char> || std::is_same_v<E, unsigned char> || std::is_same_v<E, char>) o << int(x);
  else if constexpr (std::is_arithmetic_v<E>) o << x;
  else o << "<" << sizeof(E) << " bytes>";
  return o.str();
}

template <class E>
std::string compare(const std::vector<E>& got, const std::vector<E>& want, std::size_t off = 0) {
  if (got.size() < off + want.size()) return "output too small";
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!same(got[off + i], want[i]))
      return "element " + std::to_string(off + i) + ": got " + show(got[off + i]) + ", want " + show(want[i]);
  return {};
}

template <class E, class Op>
std::vector<E> reference(const Op& op, int n, std::size_t count) {
  std::vector<E> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = reduced<E>(op, n, i);
  return v;
}

template <class E, class Op>
std::vector<E> inputs(int rank, std::size_t count) {
  std::vector<E> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = input<E, Op>(rank, i);
  return v;
}

template <class E, class Op, class Algo, class L = threads>
std::string run_all_reduce(int n, std::size_t count, bool in_place, Op op = {}, Algo a = {}) {
  const auto want = reference<E>(op, n, count);
  return run_checked<L>(n, [&](auto& comm, auto note) {
    const int r = comm.rank();
    const auto in = inputs<E, Op>(r, count);
    std::vector<E> out(count);
    if (in_place) {
      out = in;
      collx::all_reduce(comm, std::span{out}, op, a);
    } else {
      collx::all_reduce(comm, std::span<const E>{in}, std::span{out}, op, a);
      note(compare(in, inputs<E, Op>(r, count)).empty() ? "" : "the input was modified");
    }
    note(compare(out, want));
  });
}

template <class E, class Op, class Algo, class L = threads>
std::string run_reduce_scatter(int n, std::size_t k, Op op = {}, Algo a = {}) {
  const auto want = reference<E>(op, n, k * std::size_t(n));
  return run_checked<L>(n, [&](auto& comm, auto note) {
    const int r = comm.rank();
    const auto in = inputs<E, Op>(r, k * std::size_t(n));
    std::vector<E> out(k);
    collx::reduce_scatter(comm, std::span<const E>{in}, std::span{out}, op, a);
    const std::vector<E> mine(want.begin() + std::ptrdiff_t(k * std::size_t(r)), want.begin() + std::ptrdiff_t(k * std::size_t(r + 1)));
    note(compare(out, mine));
    note(compare(in, inputs<E, Op>(r, k * std::size_t(n))).empty() ? "" : "the input was modified");
  });
}

template <class E, class Op, class Algo, class L = threads>
std::string run_reduce(int n, std::size_t count, int root, Op op = {}, Algo a = {}) {
  const auto want = reference<E>(op, n, count);
  return run_checked<L>(n, [&](auto& comm, auto note) {
    const int r = comm.rank();
    const auto in = inputs<E, Op>(r, count);
    std::vector<E> out(r == root ? count : 0);
    collx::reduce(comm, std::span<const E>{in}, std::span{out}, op, root, a);
    if (r == root) note(compare(out, want));
  });
}

template <class E, class Algo, class L = threads>
std::string run_all_gather(int n, std::size_t k, Algo a = {}) {
  std::vector<E> want(k * std::size_t(n));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < k; ++i) want[std::size_t(r) * k + i] = payload<E>(r, i);
  return run_checked<L>(n, [&](auto& comm, auto note) {
    const int r = comm.rank();
    std::vector<E> in(k), out(k * std::size_t(n));
    for (std::size_t i = 0; i < k; ++i) in[i] = payload<E>(r, i);
    collx::all_gather(comm, std::span<const E>{in}, std::span{out}, a);
    note(compare(out, want));
  });
}

template <class E, class Algo, class L = threads>
std::string run_broadcast(int n, std::size_t count, int root, Algo a = {}) {
  std::vector<E> want(count);
  for (std::size_t i = 0; i < count; ++i) want[i] = payload<E>(root, i);
  return run_checked<L>(n, [&](auto& comm, auto note) {
    const int r = comm.rank();
    std::vector<E> buf(count);
    for (std::size_t i = 0; i < count; ++i) buf[i] = payload<E>(r, i);
    collx::broadcast(comm, std::span{buf}, root, a);
    note(compare(buf, want));
  });
}

/// all_gather in place, as NCCL defines it: `in` is this rank's block of `out`.
template <class E, class Algo, class L = threads>
std::string run_all_gather_in_place(int n, std::size_t k, Algo a = {}) {
  std::vector<E> want(k * std::size_t(n));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < k; ++i) want[std::size_t(r) * k + i] = payload<E>(r, i);
  return run_checked<L>(n, [&](auto& comm, auto note) {
    const int r = comm.rank();
    std::vector<E> out(k * std::size_t(n));
    for (std::size_t i = 0; i < k; ++i) out[std::size_t(r) * k + i] = payload<E>(r, i);
    collx::all_gather(comm, std::span<const E>{out.data() + std::size_t(r) * k, k}, std::span{out}, a);
    note(compare(out, want));
  });
}

/// reduce_scatter in place, as NCCL defines it: `out` is this rank's block of `in`.
template <class E, class Op, class Algo, class L = threads>
std::string run_reduce_scatter_in_place(int n, std::size_t k, Op op = {}, Algo a = {}) {
  const auto want = reference<E>(op, n, k * std::size_t(n));
  return run_checked<L>(n, [&](auto& comm, auto note) {
    const int r = comm.rank();
    auto b = inputs<E, Op>(r, k * std::size_t(n));
    collx::reduce_scatter(comm, std::span<const E>{b}, std::span{b.data() + std::size_t(r) * k, k}, op, a);
    note(compare(b, std::vector<E>(want.begin() + std::ptrdiff_t(k) * r, want.begin() + std::ptrdiff_t(k) * (r + 1)),
                 std::size_t(r) * k));
  });
}

}  // namespace collx_test
