// collx as a torch.distributed backend (PyTorch 1.13: a c10d::ProcessGroup subclass).
//
// Every call becomes one nonblocking collx call on the group's communicator (collx::async::run):
// calls complete in the order issued, on the communicator's progress thread, which also completes
// the call's future with its output tensors (DDP reads fut.value()[0]). The world's transport is
// chosen from what the ranks publish in torch's store: one host -> shm, several -> tcp, whose
// rendezvous runs through the same store (no second port); COLLX_TORCH_TRANSPORT=shm|tcp forces
// one. new_group is collx's create_group on the world: only the members take part, agreeing
// through the group's prefix store, and get channels of their own.
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "reduce.hpp"

namespace collx_torch {

wire_format parse_wire(const std::string& v, const char* from) {
  if (v.empty() || v == "none") return wire_format::none;
  if (v == "bf16") return wire_format::bf16;
  if (v == "mxfp8") return wire_format::mxfp8;
  throw std::invalid_argument(std::string("collx: ") + from + "=\"" + v + "\": the wire format is none, bf16 or mxfp8");
}

const char* red_name(red r) noexcept {
  static const char* const names[] = {"SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM"};
  return names[int(r)];
}

namespace {

/// torch's store as collx's rendezvous store (transport/tcp/store.hpp).
class torch_store final : public collx::transport::store {
 public:
  explicit torch_store(c10::intrusive_ptr<c10d::Store> s) : s_(std::move(s)) {}
  void set(const std::string& key, const std::string& value) override {
    s_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::optional<std::string> get(const std::string& key, collx::transport::net::clock::time_point deadline) override {
    for (;;) {
      if (s_->check({key})) {
        const auto v = s_->get(key);
        return std::string(v.begin(), v.end());
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - collx::transport::net::clock::now());
      if (left.count() <= 0) return std::nullopt;
      try {
        s_->wait({key}, std::min(left, std::chrono::milliseconds(1000)));
      } catch (const std::exception&) {  // its timeout: look again until ours
      }
    }
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override { return s_->add(key, delta); }
  std::string where() const override { return "torch's store"; }

 private:
  c10::intrusive_ptr<c10d::Store> s_;
};

std::string store_get(c10d::Store& s, const std::string& key) {
  const auto v = s.get(key);  // waits up to the store's timeout, then throws naming the key
  return std::string(v.begin(), v.end());
}

void store_set(c10d::Store& s, const std::string& key, const std::string& value) {
  s.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

/// Which host this rank is on, as the ranks compare them: COLLX_NODE where set (tests lay ranks
/// out on "hosts" so), else the rendezvous's id of the machine.
std::string host_id() {
  if (const char* n = std::getenv("COLLX_NODE"); n != nullptr && *n != 0) return std::string("node:") + n;
  return collx::transport::tcp_detail::rendezvous::host_id();
}

/// The future's value: the call's output tensors.
c10::intrusive_ptr<c10::ivalue::Future> make_future() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

// ---- where the backend blocks, and why none of it can deadlock --------------------------------
//
// Two kinds of lock meet here: Python's GIL, and collx's own (a communicator's turn to run calls,
// exec_, and the gate that keeps a call's continuations in order: comm/call_queue.hpp). A
// deadlock needs a thread holding one while it waits for the other, and a thread doing the
// converse. collx never holds its locks while user code runs: a call's continuation (here, the
// one that completes its torch future, which runs DDP's and PowerSGD's Python callbacks) and
// the release of a call's captures (tensors whose last reference may need the GIL to free their
// Python object) run with exec_ released. And no wait of this backend holds the GIL while it
// waits for collx's thread:
// - CollxWork::wait(), sourceRank(), result(), and exception() once done: the GIL is released
//   (without_gil) before collx's work::wait, which may run queued calls or sleep until the
//   progress thread has run them; torch's own bindings release it too, but DDP's reducer and
//   other C++ callers may hold it;
// - CollxWork's destructor (Python dropping a work, GIL held) does not wait at all: the call owns
//   its tensors (captured by value), so it may finish after its handle is gone (work::detach);
// - isCompleted(), isSuccess() and exception() before completion never block (a test of atomics);
// - barrier() is a call like any other: its wait is CollxWork::wait;
// - the destructor of a process group (Python's last reference, or destroy_process_group, with
//   the GIL held) waits for its outstanding calls and stops its communicator without the GIL;
// - the constructors (the rendezvous through torch's store) are called with the GIL released
//   (the py::init lambdas below);
// - submitting a call never blocks: the call queue takes calls from any thread without a lock.
// A Python callback that runs in a continuation takes the GIL from whichever thread holds it
// once that thread waits or lets it go (every 5 ms): nothing in collx waits on it meanwhile but
// the calls after that call, which is the order the gate keeps. That wait, like every other, has
// the communicator's deadline (the process group's timeout): a callback stuck past it fails the
// calls after it with an error that says so, and a peer's desync report reads "rank r is not
// in collx: in Python, in the callbacks of its last call's work".

/// Runs f with the GIL released when this thread holds it (and Python is not finalizing, when
/// handing the GIL over is not safe), else as it is.
template <class F>
decltype(auto) without_gil(F&& f) {
  if (Py_IsInitialized() && !_Py_IsFinalizing() && PyGILState_Check()) {
    py::gil_scoped_release nogil;
    return f();
  }
  return f();
}

/// The collx call behind one or more torch works (a coalesced batch shares one). `w` is set once,
/// before `launched` (a batch's works exist before endCoalescing launches their call).
struct call_slot {
  collx::work w;
  std::atomic<bool> launched{false};
  ~call_slot() { w.detach(); }  // never waits: the call's captures keep its tensors
  void launch(collx::work x) {
    w = std::move(x);
    launched.store(true, std::memory_order_release);
  }
  bool test() { return launched.load(std::memory_order_acquire) && w.test(); }
  void wait() {
    TORCH_CHECK(launched.load(std::memory_order_acquire),
                "collx: wait() on a call of a coalesced batch that was never ended (endCoalescing)");
    without_gil([&] { w.wait(); });
  }
};

class CollxWork final : public c10d::Work {
 public:
  CollxWork(int rank, c10d::OpType t, std::shared_ptr<call_slot> s, c10::intrusive_ptr<c10::ivalue::Future> f)
      : c10d::Work(rank, t), s_(std::move(s)), fut_(std::move(f)) {}
  bool isCompleted() override { return s_->test(); }
  bool isSuccess() const override { return s_->test() && exception() == nullptr; }
  std::exception_ptr exception() const override {
    if (!s_->test()) return nullptr;
    try {
      s_->wait();  // (done: returns at once)
      return nullptr;
    } catch (...) {
      return std::current_exception();
    }
  }
  bool wait(std::chrono::milliseconds /* the communicator's deadlines govern */) override {
    s_->wait();
    return true;
  }
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return fut_; }
  std::vector<at::Tensor> result() override {
    s_->wait();  // the future is complete once the call's continuation has run
    return fut_->value().toTensorVector();
  }
  /// The sender of a receive from any source (torch reads it after wait()).
  int sourceRank() const override {
    if (!source_) return c10d::Work::sourceRank();  // throws: not such a receive
    s_->wait();
    return source_->load(std::memory_order_acquire);
  }
  void set_source(std::shared_ptr<std::atomic<int>> s) { source_ = std::move(s); }

 private:
  std::shared_ptr<call_slot> s_;
  c10::intrusive_ptr<c10::ivalue::Future> fut_;
  std::shared_ptr<std::atomic<int>> source_;
};

/// The continuation that completes a call's future (and so runs its callbacks: DDP's, a comm
/// hook's, PowerSGD's): after the call, with no lock of collx's held (comm/call_queue.hpp).
struct complete_future {
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  std::vector<at::Tensor> outputs;
  void operator()(std::exception_ptr e) const {
    if (e) fut->setErrorIfNeeded(e);
    else fut->markCompleted(c10::IValue(outputs));
  }
};

// ---- tensors ----------------------------------------------------------------------------------

void check_tensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "collx: ", what, ": an undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "collx: ", what, ": the tensor is on ", t.device().str(),
              "; collx's torch backend takes CPU tensors");
  TORCH_CHECK(t.layout() == c10::kStrided, "collx: ", what, ": sparse tensors are not supported");
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: case at::kChar: case at::kShort:
    case at::kInt: case at::kLong: case at::kByte: case at::kBool:
      break;
    default:
      TORCH_CHECK(false, "collx: ", what, ": dtype ", c10::toString(t.scalar_type()), " is not supported (float32, float64, "
                  "float16, bfloat16, int8..int64, uint8, bool are)");
  }
}

void check_one(const std::vector<at::Tensor>& ts, const char* what) {
  TORCH_CHECK(ts.size() == 1, "collx: ", what, " takes one tensor per call (CPU), got ", ts.size());
  check_tensor(ts[0], what);
}

/// A tensor's bytes (contiguous).
std::span<std::byte> bytes(const at::Tensor& t) {
  return {static_cast<std::byte*>(t.data_ptr()), t.numel() * t.element_size()};
}

/// The inputs, flattened and concatenated into one new contiguous buffer.
at::Tensor flat_of(const std::vector<at::Tensor>& ts, const at::Tensor& like) {
  if (ts.empty()) return at::empty({0}, like.options());
  std::vector<at::Tensor> f;
  for (const auto& t : ts) f.push_back(t.reshape({-1}));
  return at::cat(f);
}

using reduce_op = op_spec;

reduce_op to_op(const c10d::ReduceOp& op, at::ScalarType t, const char* what) {
  reduce_op o;
  const bool is_float = at::isFloatingType(t);
  const bool is_bool = t == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: o.r = is_bool ? red::bor : red::sum; break;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(!is_bool, "collx: ", what, ": AVG of a bool tensor is not defined");
      o.r = red::avg;
      break;
    case c10d::ReduceOp::PRODUCT: o.r = is_bool ? red::band : red::prod; break;
    case c10d::ReduceOp::MIN: o.r = is_bool ? red::band : red::min; break;
    case c10d::ReduceOp::MAX: o.r = is_bool ? red::bor : red::max; break;
    case c10d::ReduceOp::BAND: o.r = red::band; break;
    case c10d::ReduceOp::BOR: o.r = red::bor; break;
    case c10d::ReduceOp::BXOR: o.r = red::bxor; break;
    case c10d::ReduceOp::PREMUL_SUM: {
      TORCH_CHECK(is_float, "collx: ", what, ": PREMUL_SUM scales floating-point tensors only, not ", c10::toString(t));
      o.r = red::premul_sum;
      const auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(s != nullptr, "collx: ", what, ": PREMUL_SUM without its factor");
      if (!s->tensor_factors.empty()) {
        TORCH_CHECK(s->tensor_factors[0].numel() == 1, "collx: ", what, ": PREMUL_SUM's factor tensor has ",
                    s->tensor_factors[0].numel(), " elements, not one");
        o.factor = s->tensor_factors[0].item<double>();
      } else {
        o.factor = s->double_factor;
      }
      break;
    }
    default: TORCH_CHECK(false, "collx: ", what, ": reduce op ", int(op.op_), " is not supported");
  }
  if (o.r == red::band || o.r == red::bor || o.r == red::bxor)
    TORCH_CHECK(!is_float, "collx: ", what, ": ", red_name(o.r), " is not defined for ", c10::toString(t));
  return o;
}

template <class F>
void with_element(at::ScalarType t, F&& f) {
  switch (t) {
    case at::kFloat: return f(float{});
    case at::kDouble: return f(double{});
    case at::kHalf: return f(collx::half{});
    case at::kBFloat16: return f(collx::bfloat16{});
    case at::kChar: return f(std::int8_t{});
    case at::kShort: return f(std::int16_t{});
    case at::kInt: return f(std::int32_t{});
    case at::kLong: return f(std::int64_t{});
    case at::kByte: case at::kBool: return f(std::uint8_t{});
    default: TORCH_CHECK(false, "collx: dtype ", c10::toString(t), " is not supported");
  }
}

}  // namespace

// ---- the process group ------------------------------------------------------------------------

class ProcessGroupCollx final : public c10d::ProcessGroup {
 public:
  /// The world: a rendezvous through `store`.
  /// `deterministic`: -1 leaves COLLX_DETERMINISTIC's choice; `wire`: "" leaves COLLX_WIRE's
  /// (collx_torch.Options, passed as init_process_group's pg_options).
  ProcessGroupCollx(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
                    int deterministic = -1, const std::string& wire = "")
      : c10d::ProcessGroup(rank, size) {
    collx::options o;
    if (deterministic >= 0) o.deterministic = deterministic != 0;
    wire_ = wire.empty() ? env_wire() : parse_wire(wire, "Options.wire");
    // The deadline of every wait: the process group's timeout, or COLLX_TIMEOUT_S where set (the
    // rendezvous keeps the process group's: ranks may start minutes apart)
    o.timeout = std::getenv("COLLX_TIMEOUT_S") != nullptr ? collx::detail::default_timeout() : timeout;
    const std::string kind = choose_transport(*store, rank, size);
    // Joined through torch's store (launch/join.hpp): shm agrees on its segment's job there, tcp
    // on the ranks' addresses; the listening address is the one that routes to MASTER_ADDR.
    collx::join_options j;
    j.timeout = timeout;
    j.prefix = "torch";
    if (const char* m = std::getenv("MASTER_ADDR")) j.master_addr = m;
    comm_ = std::make_unique<comm_t>(collx::join_named(kind, std::make_shared<torch_store>(store), rank, size, j), o);
    kind_ = kind;
  }

  /// A group of `members` (the parent's ranks) split from `parent`, agreeing through `store`.
  /// (`deterministic`: a group's is its parent's, and asking for the other fails; `wire`: "" takes the parent's.)
  ProcessGroupCollx(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const c10::intrusive_ptr<ProcessGroupCollx>& parent,
                    const std::vector<int>& members, const std::string& group_name, int deterministic = -1,
                    const std::string& wire = "")
      : c10d::ProcessGroup(rank, size) {
    TORCH_CHECK(int(members.size()) == size, "collx: new_group of ", size, " ranks with ", members.size(), " members");
    TORCH_CHECK(deterministic < 0 || (deterministic != 0) == parent->comm_->opts().deterministic, "collx: new_group ", group_name,
                ": Options(deterministic=", deterministic != 0 ? "True" : "False",
                "): a group is deterministic as the world is (init_process_group's pg_options, COLLX_DETERMINISTIC)");
    wire_ = wire.empty() ? parent->wire_ : parse_wire(wire, "Options.wire");
    auto agree = [&](const std::array<char, collx::split_offer::kBlob>& mine) {
      store_set(*store, "collx/offer/" + std::to_string(rank), std::string(mine.data(), mine.size()));
      std::vector<std::array<char, collx::split_offer::kBlob>> all(members.size());
      for (std::size_t q = 0; q < members.size(); ++q) {
        const std::string v = store_get(*store, "collx/offer/" + std::to_string(q));
        TORCH_CHECK(v.size() == all[q].size(), "collx: new_group ", group_name, ": a malformed offer from group rank ", q);
        std::memcpy(all[q].data(), v.data(), v.size());
      }
      return all;
    };
    comm_ = std::make_unique<comm_t>(parent->comm_->create_group(members, group_name, agree, "group " + group_name));
    kind_ = parent->kind_;
  }

  // The calls still outstanding finish (an empty call waits for those before it), then this rank
  // leaves: a peer still waiting for it is told so at once.
  // Without the GIL: the calls' continuations (Python callbacks) may need it to finish. Let go
  // from inside a continuation of its own (a future's callback dropped the last reference), the
  // group is finished on a thread of its own: this one is in the middle of its queue.
  ~ProcessGroupCollx() override {
    if (!comm_ || !comm_->valid()) return;
    auto finish = [](std::unique_ptr<comm_t> c) {
      try {
        collx::async::run(*c, [](comm_t&) {}).wait();
      } catch (...) {  // a failed communicator: nothing more to wait for
      }
      c->transport().leave();
      c.reset();  // its progress thread stops here
    };
    if (comm_->calls_queue().inside()) {
      std::thread([finish, c = std::move(comm_)]() mutable { finish(std::move(c)); }).detach();
      return;
    }
    without_gil([&] { finish(std::move(comm_)); });
  }

  const std::string getBackendName() const override { return "collx"; }
  const std::string& transport_kind() const { return kind_; }
  /// The options in force: (deterministic, wire format), as collx_torch reports them.
  bool deterministic() const { return comm_->opts().deterministic; }
  std::string wire() const { return wire_ == wire_format::bf16 ? "bf16" : wire_ == wire_format::mxfp8 ? "mxfp8" : "none"; }

  void startCoalescing() override {
    TORCH_CHECK(!batch_, "collx: startCoalescing twice without endCoalescing");
    batch_ = std::make_shared<collx::fused<collx::transport::any>>(*comm_);
  }

  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& /* reqs: they share the batch's call */) override {
    TORCH_CHECK(batch_, "collx: endCoalescing without startCoalescing");
    auto batch = std::move(batch_);
    auto done = std::move(batch_done_);
    auto slot = std::move(batch_slot_);
    batch_ = nullptr;
    batch_done_.clear();
    batch_slot_ = nullptr;
    if (!slot) return;  // nothing was added
    slot->launch(submit([batch](comm_t&) { batch->run(); }, [done](std::exception_ptr e) {
      for (auto& [f, out] : done) complete_future{f, out}(e);
    }));
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    check_one(tensors, "broadcast");
    const int root = int(opts.rootRank);
    at::Tensor t = tensors[0];
    return enqueue(c10d::OpType::BROADCAST, tensors, [t, root](comm_t& c) {
      at::Tensor b = t.contiguous();
      collx::broadcast(c, bytes(b), root);
      if (!b.is_same(t)) t.copy_(b);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    check_one(tensors, "allreduce");
    at::Tensor t = tensors[0];
    const reduce_op o = wired(to_op(opts.reduceOp, t.scalar_type(), "allreduce"));
    return enqueue(c10d::OpType::ALLREDUCE, tensors, [t, o](comm_t& c) {
      at::Tensor b = t.contiguous();
      with_element(b.scalar_type(), [&](auto e) {
        using E = decltype(e);
        reducer<E>::all_reduce(c, static_cast<E*>(b.data_ptr()), std::size_t(b.numel()), o);
      });
      if (!b.is_same(t)) t.copy_(b);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "collx: allreduce_coalesced of no tensors");
    for (const auto& t : tensors) {
      check_tensor(t, "allreduce_coalesced");
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "collx: allreduce_coalesced: the tensors' dtypes differ (",
                  c10::toString(tensors[0].scalar_type()), " and ", c10::toString(t.scalar_type()), ")");
    }
    const reduce_op o = wired(to_op(opts.reduceOp, tensors[0].scalar_type(), "allreduce_coalesced"));
    std::vector<at::Tensor> ts = tensors;
    return enqueue(c10d::OpType::ALLREDUCE_COALESCED, tensors, [ts, o](comm_t& c) {
      std::vector<at::Tensor> bs;
      for (const auto& t : ts) {
        bs.push_back(t.contiguous());
      }
      with_element(ts[0].scalar_type(), [&](auto e) {
        using E = decltype(e);
        std::vector<std::pair<E*, std::size_t>> bufs;
        for (auto& b : bs) bufs.emplace_back(static_cast<E*>(b.data_ptr()), std::size_t(b.numel()));
        reducer<E>::all_reduce_many(c, bufs, o);
      });
      for (std::size_t i = 0; i < ts.size(); ++i) {
        if (!bs[i].is_same(ts[i])) ts[i].copy_(bs[i]);
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    check_one(tensors, "reduce");
    at::Tensor t = tensors[0];
    const reduce_op o = to_op(opts.reduceOp, t.scalar_type(), "reduce");
    const int root = int(opts.rootRank), me = getRank();
    return enqueue(c10d::OpType::REDUCE, tensors, [t, o, root, me](comm_t& c) {
      at::Tensor in = t.contiguous();
      at::Tensor out = me == root ? at::empty_like(in) : at::Tensor();
      with_element(in.scalar_type(), [&](auto e) {
        using E = decltype(e);
        reducer<E>::reduce(c, static_cast<const E*>(in.data_ptr()), me == root ? static_cast<E*>(out.data_ptr()) : nullptr,
                           std::size_t(in.numel()), o, root);
      });
      if (me == root) {
        t.copy_(out);
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    check_one(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1, "collx: allgather takes one output list, got ", outputs.size());
    check_list(outputs[0], inputs[0], "allgather", "output");
    at::Tensor in = inputs[0];
    std::vector<at::Tensor> outs = outputs[0];
    return enqueue(c10d::OpType::ALLGATHER, outs, [in, outs](comm_t& c) {
      const at::Tensor src = in.contiguous();
      at::Tensor all = at::empty({std::int64_t(outs.size()) * src.numel()}, src.options());
      collx::all_gather(c, std::span<const std::byte>(bytes(src)), bytes(all));
      for (std::size_t r = 0; r < outs.size(); ++r) outs[r].copy_(all.narrow(0, std::int64_t(r) * src.numel(), src.numel()).view(outs[r].sizes()));
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) override {
    check_tensor(input, "_allgather_base");
    check_tensor(output, "_allgather_base");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "collx: _allgather_base: output dtype ", c10::toString(output.scalar_type()),
                " differs from the input's ", c10::toString(input.scalar_type()));
    TORCH_CHECK(output.numel() == input.numel() * getSize(), "collx: _allgather_base: the output has ", output.numel(),
                " elements, not ", getSize(), " x the input's ", input.numel());
    at::Tensor in = input, out = output;
    return enqueue(c10d::OpType::_ALLGATHER_BASE, {output}, [in, out](comm_t& c) {
      const at::Tensor src = in.contiguous();
      at::Tensor dst = out.contiguous();
      collx::all_gather(c, std::span<const std::byte>(bytes(src)), bytes(dst));
      if (!dst.is_same(out)) out.copy_(dst);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions&) override {
    TORCH_CHECK(int(outputs.size()) == getSize(), "collx: allgather_coalesced needs one output list per rank (", getSize(), "), got ",
                outputs.size());
    for (const auto& t : inputs) check_tensor(t, "allgather_coalesced");
    for (const auto& l : outputs) {
      TORCH_CHECK(l.size() == inputs.size(), "collx: allgather_coalesced: an output list has ", l.size(), " tensors for ", inputs.size(), " inputs");
      for (std::size_t j = 0; j < l.size(); ++j)
        TORCH_CHECK(l[j].numel() == inputs[j].numel() && l[j].scalar_type() == inputs[j].scalar_type(),
                    "collx: allgather_coalesced: output ", j, " does not match input ", j, " in size or dtype");
    }
    std::vector<at::Tensor> ins = inputs;
    std::vector<std::vector<at::Tensor>> outs = outputs;
    std::vector<at::Tensor> flat_out;
    for (const auto& l : outputs) flat_out.insert(flat_out.end(), l.begin(), l.end());
    return enqueue(c10d::OpType::ALLGATHER_COALESCED, flat_out, [ins, outs](comm_t& c) {
      std::vector<at::Tensor> bs;  // as bytes, so dtypes may differ
      for (const auto& t : ins) bs.push_back(t.contiguous().view({-1}).view(at::kByte));
      at::Tensor mine = bs.empty() ? at::empty({0}, at::kByte) : at::cat(bs);
      at::Tensor all = at::empty({std::int64_t(outs.size()) * mine.numel()}, mine.options());
      collx::all_gather(c, std::span<const std::byte>(bytes(mine)), bytes(all));
      for (std::size_t r = 0; r < outs.size(); ++r) {
        std::int64_t off = std::int64_t(r) * mine.numel();
        for (std::size_t j = 0; j < ins.size(); ++j) {
          const std::int64_t nb = bs[j].numel();
          outs[r][j].copy_(all.narrow(0, off, nb).view(ins[j].scalar_type()).view(outs[r][j].sizes()));
          off += nb;
        }
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    check_one(inputs, "gather");
    const int root = int(opts.rootRank), me = getRank();
    check_root(root, "gather");
    std::vector<at::Tensor> outs;
    if (me == root) {
      TORCH_CHECK(outputs.size() == 1, "collx: gather takes one output list on the root, got ", outputs.size());
      check_list(outputs[0], inputs[0], "gather", "output");
      outs = outputs[0];
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "collx: gather: only the root (", root,
                  ") takes output tensors");
    }
    at::Tensor in = inputs[0];
    return enqueue(c10d::OpType::GATHER, outs, [in, outs, root, me](comm_t& c) {
      const at::Tensor src = in.contiguous();
      at::Tensor all = me == root ? at::empty({std::int64_t(outs.size()) * src.numel()}, src.options()) : at::empty({0}, src.options());
      collx::gather(c, std::span<const std::byte>(bytes(src)), bytes(all), root);
      for (std::size_t r = 0; r < outs.size(); ++r) outs[r].copy_(all.narrow(0, std::int64_t(r) * src.numel(), src.numel()).view(outs[r].sizes()));
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    check_one(outputs, "scatter");
    const int root = int(opts.rootRank), me = getRank();
    check_root(root, "scatter");
    std::vector<at::Tensor> ins;
    if (me == root) {
      TORCH_CHECK(inputs.size() == 1, "collx: scatter takes one input list on the root, got ", inputs.size());
      check_list(inputs[0], outputs[0], "scatter", "input");
      ins = inputs[0];
    } else {
      TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "collx: scatter: only the root (", root,
                  ") takes input tensors");
    }
    at::Tensor out = outputs[0];
    return enqueue(c10d::OpType::SCATTER, outputs, [ins, out, root, me](comm_t& c) {
      at::Tensor src = me == root ? flat_of(ins, out) : at::empty({0}, out.options());
      at::Tensor dst = out.contiguous();
      collx::scatter(c, std::span<const std::byte>(bytes(src)), bytes(dst), root);
      if (!dst.is_same(out)) out.copy_(dst);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    check_one(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1, "collx: reduce_scatter takes one input list, got ", inputs.size());
    check_list(inputs[0], outputs[0], "reduce_scatter", "input");
    const reduce_op o = to_op(opts.reduceOp, outputs[0].scalar_type(), "reduce_scatter");
    std::vector<at::Tensor> ins = inputs[0];
    at::Tensor out = outputs[0];
    return enqueue(c10d::OpType::REDUCE_SCATTER, outputs, [ins, out, o](comm_t& c) {
      at::Tensor src = flat_of(ins, out);
      run_reduce_scatter(c, src, out, o);
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    check_tensor(input, "_reduce_scatter_base");
    check_tensor(output, "_reduce_scatter_base");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "collx: _reduce_scatter_base: the output's dtype differs from the input's");
    TORCH_CHECK(input.numel() == output.numel() * getSize(), "collx: _reduce_scatter_base: the input has ", input.numel(),
                " elements, not ", getSize(), " x the output's ", output.numel());
    const reduce_op o = to_op(opts.reduceOp, output.scalar_type(), "_reduce_scatter_base");
    at::Tensor in = input, out = output;
    return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, [in, out, o](comm_t& c) {
      at::Tensor src = in.contiguous();
      run_reduce_scatter(c, src, out, o);
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits, const c10d::AllToAllOptions&) override {
    check_tensor(input, "alltoall_base");
    check_tensor(output, "alltoall_base");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "collx: alltoall_base: the output's dtype differs from the input's");
    const int n = getSize();
    auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
      std::vector<std::size_t> c(static_cast<std::size_t>(n));
      const std::int64_t rows = t.dim() == 0 ? 1 : t.size(0);
      const std::int64_t row_bytes = rows == 0 ? 0 : t.numel() / rows * t.element_size();
      if (splits.empty()) {
        TORCH_CHECK(rows % n == 0, "collx: alltoall_base: the ", which, "'s first dimension (", rows, ") does not divide by ", n,
                    " ranks (give split sizes)");
        for (auto& x : c) x = std::size_t(rows / n * row_bytes);
      } else {
        TORCH_CHECK(int(splits.size()) == n, "collx: alltoall_base: ", splits.size(), " ", which, " split sizes for ", n, " ranks");
        std::int64_t sum = 0;
        for (int q = 0; q < n; ++q) {
          TORCH_CHECK(splits[std::size_t(q)] >= 0, "collx: alltoall_base: a negative ", which, " split size");
          c[std::size_t(q)] = std::size_t(splits[std::size_t(q)] * row_bytes);
          sum += splits[std::size_t(q)];
        }
        TORCH_CHECK(sum == rows, "collx: alltoall_base: the ", which, " split sizes add up to ", sum, ", not its ", rows, " rows");
      }
      return c;
    };
    std::vector<std::size_t> sc = counts(input, in_splits, "input"), rc = counts(output, out_splits, "output");
    at::Tensor in = input, out = output;
    return enqueue(c10d::OpType::ALLTOALL_BASE, {output}, [in, out, sc, rc](comm_t& c) {
      const at::Tensor src = in.contiguous();
      at::Tensor dst = out.contiguous();
      collx::all_to_all_v(c, std::span<const std::byte>(bytes(src)), std::span<const std::size_t>(sc), bytes(dst),
                          std::span<const std::size_t>(rc));
      if (!dst.is_same(out)) out.copy_(dst);
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    const int n = getSize();
    TORCH_CHECK(int(inputs.size()) == n && int(outputs.size()) == n, "collx: alltoall needs ", n, " input and output tensors, got ",
                inputs.size(), " and ", outputs.size());
    std::vector<std::size_t> sc, rc;
    for (int q = 0; q < n; ++q) {
      check_tensor(inputs[std::size_t(q)], "alltoall");
      check_tensor(outputs[std::size_t(q)], "alltoall");
      sc.push_back(std::size_t(inputs[std::size_t(q)].numel() * inputs[std::size_t(q)].element_size()));
      rc.push_back(std::size_t(outputs[std::size_t(q)].numel() * outputs[std::size_t(q)].element_size()));
    }
    std::vector<at::Tensor> ins = inputs, outs = outputs;
    return enqueue(c10d::OpType::ALLTOALL, outputs, [ins, outs, sc, rc](comm_t& c) {
      std::vector<at::Tensor> bs;
      for (const auto& t : ins) bs.push_back(t.contiguous().view({-1}).view(at::kByte));
      at::Tensor src = at::cat(bs);
      std::size_t total = 0;
      for (auto x : rc) total += x;
      at::Tensor dst = at::empty({std::int64_t(total)}, at::kByte);
      collx::all_to_all_v(c, std::span<const std::byte>(bytes(src)), std::span<const std::size_t>(sc), bytes(dst),
                          std::span<const std::size_t>(rc));
      std::int64_t off = 0;
      for (std::size_t q = 0; q < outs.size(); ++q) {
        outs[q].copy_(dst.narrow(0, off, std::int64_t(rc[q])).view(outs[q].scalar_type()).view(outs[q].sizes()));
        off += std::int64_t(rc[q]);
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int /* tag */) override {
    check_one(tensors, "send");
    check_peer(dst, "send");
    at::Tensor src = tensors[0].contiguous();
    if (batch_) {
      batch_->send(std::span<const std::byte>(bytes(src)), dst);
      return in_batch(c10d::OpType::SEND, {src});
    }
    return enqueue(c10d::OpType::SEND, tensors, [src, dst](comm_t& c) { collx::send(c, std::span<const std::byte>(bytes(src)), dst); });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int /* tag */) override {
    check_one(tensors, "recv");
    check_peer(src, "recv");
    at::Tensor t = tensors[0];
    TORCH_CHECK(t.is_contiguous(), "collx: recv into a non-contiguous tensor is not supported (receive into a contiguous one, then copy)");
    if (batch_) {
      batch_->recv(bytes(t), src);
      return in_batch(c10d::OpType::RECV, {t});
    }
    return enqueue(c10d::OpType::RECV, tensors, [t, src](comm_t& c) { collx::recv(c, bytes(t), src); });
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int /* tag */) override {
    check_one(tensors, "recv from any source");
    TORCH_CHECK(getSize() > 1, "collx: recv from any source: there is no other rank in a group of one");
    TORCH_CHECK(!batch_, "collx: a receive from any source cannot be coalesced (batch_isend_irecv names every peer)");
    at::Tensor t = tensors[0];
    TORCH_CHECK(t.is_contiguous(), "collx: recv into a non-contiguous tensor is not supported (receive into a contiguous one, then copy)");
    auto source = std::make_shared<std::atomic<int>>(-1);
    auto w = enqueue(c10d::OpType::RECVANYSOURCE, tensors,
                     [t, source](comm_t& c) { source->store(collx::recv_any(c, bytes(t)), std::memory_order_release); });
    static_cast<CollxWork*>(w.get())->set_source(std::move(source));
    return w;
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return enqueue(c10d::OpType::BARRIER, {}, [](comm_t& c) { collx::barrier(c); });
  }

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }

 private:
  template <class F>
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs, F body) {
    ++seq_;
    auto fut = make_future();
    if (batch_) {
      batch_->then(body);  // its future completes with the batch's (endCoalescing)
      return in_batch(type, outputs, fut);
    }
    auto slot = std::make_shared<call_slot>();
    slot->launch(submit(std::move(body), complete_future{fut, std::move(outputs)}));
    return c10::make_intrusive<CollxWork>(getRank(), type, slot, fut);
  }

  /// The call `body`, with `then` (which completes its futures) its continuation from the start.
  /// A call made from a continuation of this group's (a future's callback: PowerSGD's) runs at
  /// once, on this thread, for as long as the collective takes: without the GIL.
  template <class F, class C>
  collx::work submit(F body, C then) {
    if (comm_->calls_queue().runs_at_once())
      return without_gil([&] { return collx::async::run(*comm_, std::move(body), std::move(then)); });
    return collx::async::run(*comm_, std::move(body), std::move(then));
  }

  /// A call added to the open coalesced batch: its work completes with the batch.
  c10::intrusive_ptr<c10d::Work> in_batch(c10d::OpType type, std::vector<at::Tensor> outputs,
                                          c10::intrusive_ptr<c10::ivalue::Future> fut = make_future()) {
    if (!batch_slot_) batch_slot_ = std::make_shared<call_slot>();
    batch_done_.emplace_back(fut, std::move(outputs));
    return c10::make_intrusive<CollxWork>(getRank(), type, batch_slot_, fut);
  }

  static void run_reduce_scatter(comm_t& c, at::Tensor& src, const at::Tensor& out, const reduce_op& o) {
    at::Tensor dst = out.contiguous();
    with_element(src.scalar_type(), [&](auto e) {
      using E = decltype(e);
      reducer<E>::reduce_scatter(c, static_cast<const E*>(src.data_ptr()), static_cast<E*>(dst.data_ptr()), std::size_t(dst.numel()), o);
    });
    if (!dst.is_same(out)) const_cast<at::Tensor&>(out).copy_(dst);
  }

  void check_root(int root, const char* what) const {
    TORCH_CHECK(root >= 0 && root < getSize(), "collx: ", what, ": root ", root, " is out of range for ", getSize(), " ranks");
  }
  void check_peer(int peer, const char* what) const {
    TORCH_CHECK(peer >= 0 && peer < getSize() && peer != getRank(), "collx: ", what, ": peer ", peer, " is not another rank of ",
                getSize(), " (this is rank ", getRank(), ")");
  }
  void check_list(const std::vector<at::Tensor>& l, const at::Tensor& like, const char* what, const char* which) const {
    TORCH_CHECK(int(l.size()) == getSize(), "collx: ", what, ": ", l.size(), " ", which, " tensors for ", getSize(), " ranks");
    for (const auto& t : l) {
      check_tensor(t, what);
      TORCH_CHECK(t.numel() == like.numel() && t.scalar_type() == like.scalar_type(), "collx: ", what, ": an ", which, " tensor of ",
                  t.numel(), " x ", c10::toString(t.scalar_type()), " where ", like.numel(), " x ", c10::toString(like.scalar_type()),
                  " is expected");
    }
  }

  static std::string choose_transport(c10d::Store& store, int rank, int size) {
    std::string forced;
    if (const char* e = std::getenv("COLLX_TORCH_TRANSPORT")) forced = e;
    // The transports between processes (core/transports.hpp) may be asked for by name.
    const bool two = forced == "two_level";
    const collx::transport_entry* t = forced.empty() || forced == "auto" || two ? nullptr : collx::find_transport(forced);
    TORCH_CHECK(forced.empty() || forced == "auto" || two ||
                    (t != nullptr && (t->ranks == collx::rank_kind::processes || t->ranks == collx::rank_kind::hosts)),
                "collx: COLLX_TORCH_TRANSPORT is \"", forced, "\": use ",
                collx::transport_flags(collx::rank_kind::processes, collx::rank_kind::hosts), ", two_level or auto");
    // Every rank publishes its host and reads the others' (so each decides alike).
    store_set(store, "collx/host/" + std::to_string(rank), host_id());
    std::vector<std::string> hosts;
    for (int q = 0; q < size; ++q) {
      const std::string h = store_get(store, "collx/host/" + std::to_string(q));
      if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
    }
    const bool one_host = hosts.size() == 1;
    if (t != nullptr) {
      TORCH_CHECK(one_host || t->ranks != collx::rank_kind::processes, "collx: COLLX_TORCH_TRANSPORT=", forced,
                  ", but the ranks are on more than one host");
      return std::string(t->name);
    }
    // One host: shared memory. Several, one rank on each: tcp. Several with ranks that share
    // one: shared memory among those, tcp between hosts (transport::two_level; automatic then
    // weighs the node-aware collectives: docs/nodes.md).
    if (two || (!one_host && int(hosts.size()) < size)) return "two_level";
    return one_host ? "shm" : "tcp";
  }

  std::unique_ptr<comm_t> comm_;
  static wire_format env_wire() {
    const char* v = std::getenv("COLLX_WIRE");
    return parse_wire(v != nullptr ? v : "", "COLLX_WIRE");
  }
  /// A float SUM/AVG all-reduce's op, with this group's wire format.
  reduce_op wired(reduce_op o) const {
    o.wire = wire_;
    return o;
  }

  std::string kind_;
  wire_format wire_ = wire_format::none;
  std::atomic<std::uint64_t> seq_{0};
  std::shared_ptr<collx::fused<collx::transport::any>> batch_;
  std::shared_ptr<call_slot> batch_slot_;
  std::vector<std::pair<c10::intrusive_ptr<c10::ivalue::Future>, std::vector<at::Tensor>>> batch_done_;
};

}  // namespace collx_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using collx_torch::ProcessGroupCollx;
  py::module::import("torch.distributed");
  collx::flight::set_caller_python(true);  // a peer's desync report says "in Python" of a rank not in collx
  py::class_<ProcessGroupCollx, c10::intrusive_ptr<ProcessGroupCollx>, c10d::ProcessGroup>(m, "ProcessGroupCollx")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
                       int deterministic, const std::string& wire) {
             py::gil_scoped_release nogil;
             return c10::make_intrusive<ProcessGroupCollx>(store, rank, size, timeout, deterministic, wire);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("deterministic") = -1,
           py::arg("wire") = "")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       const c10::intrusive_ptr<ProcessGroupCollx>& parent, const std::vector<int>& members,
                       const std::string& name, int deterministic, const std::string& wire) {
             py::gil_scoped_release nogil;
             return c10::make_intrusive<ProcessGroupCollx>(store, rank, size, parent, members, name, deterministic, wire);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("parent"), py::arg("members"), py::arg("name"),
           py::arg("deterministic") = -1, py::arg("wire") = "")
      .def_property_readonly("transport", &ProcessGroupCollx::transport_kind)
      .def_property_readonly("deterministic", &ProcessGroupCollx::deterministic)
      .def_property_readonly("wire", &ProcessGroupCollx::wire);
  // For the tests: a work's wait() called from C++ with the GIL held, as DDP's reducer and other
  // C++ callers of torch may call it (torch's own Python binding of wait() releases the GIL).
  m.def("_wait_holding_gil", [](const c10::intrusive_ptr<c10d::Work>& w) { return w->wait(); });
}
