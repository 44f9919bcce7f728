#pragma once
// The one executor loop: runs a rank's schedule over its communicator's transport. For each step
// it performs the local copies, then hands the step's sends and receives to the transport in one
// exchange call (so a transport can overlap them: a ring step sends and receives at once), and at
// the end applies the op's finalize (avg's division) to the regions the schedule names.
//
// Any failure poisons the communicator through transport.abort(), so peers stop waiting for this
// rank and fail fast with errc::peer_lost instead of running into their timeouts.
#include <cstring>
#include <exception>
#include <span>
#include <vector>

#include "../comm/communicator.hpp"
#include "../ops/apply.hpp"
#include "../ops/ops.hpp"
#include "../core/schedule.hpp"
#include "../core/call_info.hpp"
#include "../core/deliver.hpp"
#include "../core/topology.hpp"

/// Argument checks, done before anything is sent: the message is built only on failure, and a
/// failure fails the communicator for every rank (detail::fail_argument), as any other does.
#define COLLX_REQUIRE(ok, comm, call, what)                               \
  do {                                                                    \
    if (!(ok)) ::collx::detail::fail_argument((comm), (call), (what));    \
  } while (0)

namespace collx {

namespace detail {

/// A bad argument on this rank. The call has taken its sequence number, and its peers are about
/// to wait for this rank in it, so it fails the communicator, as any failure does: the peers
/// stop at once with errc::peer_lost and this reason, instead of waiting out their deadline or
/// numbering every later call one off.
template <class T>
[[noreturn]] void fail_argument(communicator<T>& comm, const call_info& call, const std::string& what) {
  const std::string msg = call.prefix() + " " + what;
  if (call.rec != nullptr) call.rec->set_error(int(errc::invalid_argument), msg);
  comm.transport().abort(msg);
  throw error(errc::invalid_argument, msg);
}

/// The order of comm's calls (comm/call_queue.hpp); a null communicator fails the call here.
template <class T>
call_queue& queue_of(communicator<T>& comm, const char* collective) {
  if (!comm.valid())
    throw error(errc::invalid_argument, std::string(collective) +
                                            ": the communicator is null (this rank passed collx::no_color to split)");
  return comm.calls_queue();
}

/// a + b, or an invalid_argument failure when it does not fit a size_t (sums of user counts).
template <class T>
std::size_t checked_add(communicator<T>& comm, const call_info& call, std::size_t a, std::size_t b, const char* what) {
  std::size_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail_argument(comm, call, std::string(what) + " overflow a size_t");
  return r;
}

/// a * b, likewise.
template <class T>
std::size_t checked_mul(communicator<T>& comm, const call_info& call, std::size_t a, std::size_t b, const char* what) {
  std::size_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail_argument(comm, call, std::string(what) + " overflow a size_t");
  return r;
}

// Memory belongs to the transport. Dispatched on its memory_space: a host transport's buffers
// are reduced, copied and finalized here; a transport of another space takes whole schedules
// and names its own copy_local and finalize (check_transport says so when it does not), so a
// misspelt hook fails to compile instead of falling back to host code on device pointers.
template <class T>
inline constexpr bool host_memory_v = std::is_same_v<typename T::memory_space, host_memory>;

/// Copies every part (done on return): memmove in host memory, else the transport's copy_local
/// takes them all at once (a device transport waits once, not once a part).
template <class T>
void local_copies(T& t, std::span<const local_copy_part> parts) {
  if constexpr (host_memory_v<T>) {
    for (const local_copy_part& p : parts) std::memmove(p.dst, p.src, p.bytes);
  } else {
    t.copy_local(parts);
  }
}
template <class T>
void local_copy(T& t, std::byte* dst, const std::byte* src, std::size_t bytes) {
  const local_copy_part one{dst, src, bytes};
  local_copies(t, std::span<const local_copy_part>(&one, 1));
}

/// The library's own calls on host memory (split's agreement, automatic's parameters) run on
/// any communicator: on a transport of another memory space, f(buf) gets a copy of `bytes` at
/// `host` in the transport's own memory (`host_staging`, filled and read back through its
/// `copy_from_host` / `copy_to_host`), not host pointers its kernels cannot read.
template <class T, class F>
void on_transport_memory(communicator<T>& comm, std::byte* host, std::size_t bytes, F&& f) {
  if constexpr (host_memory_v<T>) {
    f(host);
  } else {
    T& t = comm.transport();
    std::byte* d = t.host_staging(bytes);
    t.copy_from_host(d, host, bytes);
    f(d);
    t.copy_to_host(host, d, bytes);
  }
}

template <class E, class Op, class T>
void finalize(T& t, E* p, std::size_t count, int n) {
  if constexpr (host_memory_v<T>) {
    for (std::size_t i = 0; i < count; ++i) p[i] = Op::finalize(p[i], n);
  } else {
    t.template finalize<E, Op>(p, count, n);
  }
}

/// Where a region is: a pointer, or a place in pieces.
struct located {
  std::byte* p = nullptr;
  operand spread{};
};

/// The buffers a schedule runs over (its buf::in and buf::out): two pointers, or, for a fused
/// batch (features/fuse.hpp), its parts spread over pieces. locate() says where element `off` of one is;
/// `+ n` moves both on by n elements (the segments of a large call).
template <class E>
struct flat_buffers {
  const E* in;
  E* out;
  located locate(buf b, std::size_t off) const {
    E* base = b == buf::in ? const_cast<E*>(in) : b == buf::out ? out : nullptr;
    return {base == nullptr ? nullptr : reinterpret_cast<std::byte*>(base + off), {}};
  }
  flat_buffers operator+(std::size_t n) const { return {in + n, out + n}; }
  bool in_place() const { return in == out; }
};
template <class E>
struct spread_buffers {
  const pieces* in;
  const pieces* out;
  std::size_t at = 0;  // elements
  located locate(buf b, std::size_t off) const {
    const pieces* m = b == buf::in ? in : b == buf::out ? out : nullptr;
    return m == nullptr ? located{} : located{nullptr, {m, (at + off) * sizeof(E)}};
  }
  spread_buffers operator+(std::size_t n) const { return {in, out, at + n}; }
  bool in_place() const { return in == out; }
};

/// Calls f(dst, src, bytes) for each contiguous run of `bytes` bytes from src to dst.
template <class F>
void copy_runs(const located& dst, const located& src, std::size_t bytes, F&& f) {
  std::size_t dh = SIZE_MAX, sh = SIZE_MAX;
  for (std::size_t off = 0; off < bytes;) {
    std::size_t len = bytes - off;
    std::byte* d = operand_at(dst.p, dst.spread, off, len, dh);
    const std::byte* s = operand_at(static_cast<const std::byte*>(src.p), src.spread, off, len, sh);
    f(d, s, len);
    off += len;
  }
}

/// The op's finalize (avg's division) over `count` elements at x.
template <class E, class Op, class T>
void finalize_at(communicator<T>& comm, const located& x, std::size_t count) {
  copy_runs(x, x, count * sizeof(E), [&](std::byte* d, const std::byte*, std::size_t n) {
    finalize<E, Op>(comm.transport(), reinterpret_cast<E*>(d), n / sizeof(E), comm.size());
  });
}

/// A fold (core/schedule.hpp: fold_op) in host memory: dst = srcs[0] ⊕ srcs[1] ⊕ ..., over the
/// runs where every operand is contiguous (a fused batch's pieces split them).
template <class E, class Op>
void fold_at(const Op& op, const located& dst, std::span<const located> srcs, std::size_t count, int finalize_n) {
  thread_local std::vector<const E*> p;
  thread_local std::vector<std::size_t> hint;
  p.assign(srcs.size(), nullptr);
  hint.assign(srcs.size(), SIZE_MAX);
  std::size_t dh = SIZE_MAX;
  const std::size_t bytes = count * sizeof(E);
  for (std::size_t off = 0; off < bytes;) {
    std::size_t len = bytes - off;
    std::byte* d = operand_at(dst.p, dst.spread, off, len, dh);
    for (std::size_t k = 0; k < srcs.size(); ++k)
      p[k] = reinterpret_cast<const E*>(operand_at(static_cast<const std::byte*>(srcs[k].p), srcs[k].spread, off, len, hint[k]));
    ops::fold_into<E>(op, reinterpret_cast<E*>(d), std::span<const E* const>(p), len / sizeof(E), finalize_n);
    off += len;
  }
}

/// A failure's message in the call's flight record (comm/flight.hpp), if it has none yet: one that
/// did not come through call_info::fail (a socket's, an allocation's).
inline void note_failure(const call_info& call, const std::exception& e) {
  note_last_error(e.what());
  if (call.rec == nullptr) return;
  const auto* ce = dynamic_cast<const error*>(&e);
  call.rec->set_error(ce != nullptr ? ce->code().value() : -1, e.what());
}

/// Opens the call's flight record (comm/flight.hpp) on comm's recorder, when it is on.
template <class T>
void open_record(communicator<T>& comm, call_info& c) {
  detail::flight_recorder& fr = comm.recorder();
  if (!fr.enabled()) return;
  c.rec = fr.open(c.sig, tl_issued_ns);
  if (c.rec == nullptr) return;
  c.board = fr.board();
  c.mark.close = &flight_recorder::close_fn;
  c.mark.recorder = &fr;
  c.mark.rec = c.rec;
  c.mark.uncaught = uncaught_exceptions();
}

/// A transport that takes whole schedules (core/concepts.hpp: RunsSchedules) runs this rank's; the
/// op's finalize follows through the transport's hook. Its buffers are always two pointers: a
/// fused batch packs for it (it does not take pieces).
template <class T, class E, class Op, class Bufs>
void run_whole(communicator<T>& comm, const call_info& call, const schedule& s, const Bufs& b, const Op& op) {
  if constexpr (!std::is_same_v<Bufs, flat_buffers<E>>) {
    call.fail(errc::invalid_argument, "a transport that runs whole schedules was given a spread buffer");
  } else {
    try {
      comm.transport().template run_schedule<E>(call, s, b.in, b.out, op);
      if constexpr (has_finalize_v<Op, E>)
        for (const region& r : s.finals()) finalize_at<E, Op>(comm, b.locate(r.b, r.offset), r.count);
    } catch (const std::exception& e) {
      note_failure(call, e);
      comm.transport().abort(e.what());
      throw;
    }
  }
}

/// The host executor: one exchange() per step.
template <class T, class E, class Op, class Bufs>
void execute_steps(communicator<T>& comm, const call_info& call, const schedule& s, const Bufs& b, const Op& op) {
  E* tmp = s.tmp_elems() ? reinterpret_cast<E*>(comm.scratch(s.tmp_elems() * sizeof(E))) : nullptr;
  auto at = [&](const region& r) -> located {
    if (r.b == buf::tmp) return {tmp ? reinterpret_cast<std::byte*>(tmp + r.offset) : nullptr, {}};
    return b.locate(r.b, r.offset);
  };
  combiner comb;
  if constexpr (!std::is_same_v<Op, no_op>) comb = ops::host_combiner<E>(op);
  comb.elem_size = sizeof(E);
  const exchange_context ctx{&call, comb, call.synchronous};

  thread_local std::vector<send_desc> sends;
  thread_local std::vector<recv_desc> recvs;
  try {
    for (const step& st : s.steps()) {
      for (auto i = st.copies_begin; i < st.copies_end; ++i) {
        const copy_op& c = s.copies()[i];
        copy_runs(at(c.dst), at(c.src), c.src.count * sizeof(E), [&](std::byte* d, const std::byte* x, std::size_t n) {
          local_copy(comm.transport(), d, x, n);
        });
      }
      if (st.folds_begin != st.folds_end) {
        if constexpr (std::is_same_v<Op, no_op> || !host_memory_v<T>) {
          call.fail(errc::invalid_argument, "a schedule that folds (the deterministic mode) needs a reducing op over host memory");
        } else {
          thread_local std::vector<located> from;
          for (auto i = st.folds_begin; i < st.folds_end; ++i) {
            const fold_op& f = s.folds()[i];
            from.clear();
            for (const region& r : s.srcs_of(f)) from.push_back(at(r));
            fold_at<E>(op, at(f.dst), std::span<const located>(from), f.dst.count, f.complete ? comm.size() : 0);
          }
        }
      }
      sends.clear();
      recvs.clear();
      for (auto i = st.sends_begin; i < st.sends_end; ++i) {
        const send_op& o = s.sends()[i];
        const located x = at(o.src);
        sends.push_back({o.peer, x.p, o.src.count * sizeof(E), x.spread});
      }
      for (auto i = st.recvs_begin; i < st.recvs_end; ++i) {
        const recv_op& o = s.recvs()[i];
        const located d = at(o.dst);
        const located w = o.how == combine::copy ? located{} : at(o.with);
        recvs.push_back({o.peer, d.p, o.dst.count * sizeof(E), w.p, o.how, d.spread, w.spread});
      }
      if (!sends.empty() || !recvs.empty()) comm.transport().exchange(sends, recvs, ctx);
    }
    if constexpr (has_finalize_v<Op, E>) {
      for (const region& r : s.finals()) finalize_at<E, Op>(comm, at(r), r.count);
    }
  } catch (const std::exception& e) {
    note_failure(call, e);
    comm.transport().abort(e.what());
    throw;
  }
}

template <class T, class E, class Op, class Bufs>
void execute(communicator<T>& comm, const call_info& call, const schedule& s, const Bufs& b, const Op& op) {
  if constexpr (RunsSchedules<T>) {
    run_whole<T, E, Op>(comm, call, s, b, op);
  } else {
    execute_steps<T, E, Op>(comm, call, s, b, op);
  }
}

template <class T, class E, class Op>
void execute(communicator<T>& comm, const call_info& call, const schedule& s, const E* in, E* out, const Op& op) {
  execute<T, E, Op>(comm, call, s, flat_buffers<E>{in, out}, op);
}

/// f(the node map of comm's transport): its own (transport::two_level), looking through
/// decorators (counting, any's inner()), else one node of every rank.
template <class T, class F>
decltype(auto) with_nodes(communicator<T>& comm, F&& f) {
  auto find = [&](auto& self, const auto& t) -> const node_map* {
    if constexpr (requires { t.nodes(); }) return &t.nodes();
    else if constexpr (requires { t.inner(); }) return self(self, t.inner());
    else return nullptr;
  };
  if (const node_map* m = find(find, comm.transport())) return f(*m);
  return f(node_map::one_node(comm.size()));
}

/// f(within, between, nodes) where t is laid out on nodes with a transport for each level
/// (transport::two_level, also inside transport::any; looking through decorators): the two
/// transports' names and the node map. Nothing else.
template <class Tr, class F>
void with_levels(const Tr& t, F&& f) {
  if constexpr (requires { t.level_kinds(); t.nodes(); }) {
    const auto k = t.level_kinds();
    if (k.first != nullptr && k.second != nullptr) f(k.first, k.second, t.nodes());
  } else if constexpr (requires { t.inner(); }) {
    with_levels(t.inner(), f);
  }
}

/// The schedule `make` builds: make(the node map) where the policy's schedule takes one (a
/// node-aware policy: algo/two_level.hpp), over comm's (with_nodes); make() for any other. Give
/// `make` a return type that names the call (`-> decltype(pol.f(p, m...))`), so that which of the
/// two it takes is read from its signature.
template <class T, class Make>
schedule plan(communicator<T>& comm, Make&& make) {
  if constexpr (std::is_invocable_v<Make&, const node_map&>) return with_nodes(comm, make);
  else return make();
}

/// A schedule's kind: its address tells the (policy, problem, variant) types apart. Not const:
/// a linker that folds identical read-only constants (lld --icf=all, -fmerge-all-constants) could
/// give two kinds one address, and two schedules one key.
template <class Policy, class Problem, int Variant>
inline char schedule_kind = 0;

/// The key of `pol`'s schedule for problem `p`: every field of the policy and of the problem
/// (comm/schedule_cache.hpp: add_fields), and `Variant`, which tells apart two schedules one policy
/// builds for one problem type. (Not a template of the transport or the caller's builder.)
template <int Variant, class Policy, class Problem>
schedule_key key_of(const Policy& pol, const Problem& p) {
  schedule_key k;
  k.kind = &schedule_kind<Policy, Problem, Variant>;
  add_fields(k, pol);
  add_fields(k, p);
  return k;
}

/// The cached schedule of `pol` for problem `p`, built by `build` when not cached. The pointer is
/// good until two more schedules have been got from comm (comm/schedule_cache.hpp).
template <int Variant = 0, class Policy, class Problem, class T, class Build>
const schedule* cached(communicator<T>& comm, const Policy& pol, const Problem& p, Build&& build) {
  return comm.schedules().get(key_of<Variant>(pol, p), build);
}

/// avg's division over out[0, count), once every segment of an all_reduce has run.
template <class E, class Op, class T, class Bufs>
void finalize_all(communicator<T>& comm, const Bufs& b, std::size_t count) {
  finalize_at<E, Op>(comm, b.locate(buf::out, 0), count);
}

/// An op that scales each rank's contribution first (ops::premul_sum: has_prescale_v): `count`
/// elements of `in` scaled into `out` (which may be `in`), on the host.
template <class E, class Op, class T>
void prescale(communicator<T>&, const Op& op, const E* in, E* out, std::size_t count) {
  static_assert(host_memory_v<T>, "collx: ops::premul_sum scales each rank's input on the host: a transport of another "
                                  "memory space takes a plain sum over inputs it has scaled itself");
  for (std::size_t i = 0; i < count; ++i) out[i] = op.prescale(in[i]);
}

/// The buffers an all_reduce runs over once this rank's contribution is scaled: out of place,
/// `in` scaled into `out`, then in place on `out`; in place (a fused batch's pieces too), where
/// they are. The buffers themselves for any other op.
template <class E, class Op, class T, class Bufs>
Bufs prescaled(communicator<T>& comm, const Op& op, const Bufs& b, std::size_t count) {
  if constexpr (!has_prescale_v<Op, E>) {
    return b;
  } else if constexpr (std::is_same_v<Bufs, flat_buffers<E>>) {
    prescale<E>(comm, op, b.in, b.out, count);
    return {b.out, b.out};
  } else {
    copy_runs(b.locate(buf::out, 0), b.locate(buf::out, 0), count * sizeof(E), [&](std::byte* d, const std::byte*, std::size_t n) {
      prescale<E>(comm, op, reinterpret_cast<const E*>(d), reinterpret_cast<E*>(d), n / sizeof(E));
    });
    return b;
  }
}

/// Builds the call_info every collective starts with; the sequence number advances here.
template <class E, class Op, class T>
call_info make_call(communicator<T>& comm, const char* collective, const char* policy, std::size_t count, int root = -1) {
  call_info c;
  detail::set_name(c.sig.collective, collective);
  detail::set_name(c.sig.policy, policy);
  if constexpr (!std::is_same_v<Op, no_op>) {
    static constexpr std::string_view op_type = detail::type_name<Op>();
    static constexpr std::uint64_t op_hash = detail::fnv1a(op_type);
    if constexpr (requires { Op::name; }) detail::set_name(c.sig.op, Op::name);
    else detail::set_name(c.sig.op, op_type);
    c.sig.op_hash = op_hash;
  }
  c.sig.seq = comm.next_seq();
  c.sig.comm = comm.identity().hash;
  c.comm = &comm.identity();
  c.sig.empty_calls = comm.empty_calls();
  c.sig.count = count;
  c.sig.elem_size = std::uint32_t(sizeof(E));
  c.sig.root = root;
  c.rank = comm.rank();
  c.timeout = comm.opts().timeout;
  c.call_timeout = comm.opts().call_timeout;
  open_record(comm, c);
  return c;
}

/// A call with zero elements returns at once, exchanging nothing (as MPI and NCCL do); it is
/// folded into the digest the next exchanging call carries (core/call_info.hpp). True when skipped.
template <class T>
bool skip_if_empty(communicator<T>& comm, const call_info& call) {
  if (call.sig.count != 0) return false;
  comm.set_empty_calls(call.sig.fold_empty(comm.empty_calls()));
  return true;
}

}  // namespace detail
}  // namespace collx
