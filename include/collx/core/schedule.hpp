#pragma once
// A schedule is what a policy produces and what the executor runs: for one rank, an ordered list
// of steps, each a set of local copies followed by sends and receives that proceed together.
// Policies are pure functions from a problem (rank, size, partition, root, ...) to a schedule;
// they do no I/O. The executor (collectives/executor.hpp) is the one loop that turns steps into transport
// calls, the model walks the same data to count steps and bytes, and examples print it.
//
// Regions name a buffer (the caller's input, the caller's output, or scratch owned by the call)
// and an element range in it, so a schedule is independent of the element type and of where the
// memory lives (host or device: that is the transport's business).
#include <algorithm>
#include <climits>
#include <cstddef>
#include <memory>
#include <span>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace collx {

enum class buf : std::uint8_t { none, in, out, tmp };

struct region {
  buf b = buf::none;
  std::size_t offset = 0;  // elements
  std::size_t count = 0;   // elements
  constexpr region sub(std::size_t off, std::size_t n) const { return {b, offset + off, n}; }
  friend constexpr bool operator==(const region&, const region&) = default;
};

/// How a received block combines with a local one.
enum class combine : std::uint8_t {
  copy,           // dst = received
  received_left,  // dst = received ⊕ with   (the sender holds lower-ranked contributions)
  received_right  // dst = with ⊕ received   (the sender holds higher-ranked contributions)
};

struct copy_op { region dst, src; };
/// dst = src_0 ⊕ src_1 ⊕ ... in that order, accumulated in the op's accumulator type and rounded
/// once into dst (ops::accumulator_t); dst may be one of the sources. The deterministic mode's
/// reduction (algo/deterministic.hpp): whatever order the contributions arrive in, each element
/// is reduced in rank order. Its sources are fold_srcs()[srcs_begin, srcs_end). A `complete`
/// fold reduces every rank's contribution: the op's finalize (avg's division by the rank count)
/// runs on the accumulator before the one rounding, and the schedule names no final region for
/// what it writes.
struct fold_op {
  region dst;
  std::uint32_t srcs_begin = 0, srcs_end = 0;
  bool complete = false;
};
struct send_op { int peer; region src; };
struct recv_op {
  int peer;
  region dst;
  region with;  // the local operand when combining; ignored for combine::copy
  combine how = combine::copy;
};

/// One step: its index on the global timeline (steps of all ranks with equal time run
/// together), and the ranges of its operations in the schedule's flat arrays. Its local
/// operations run first, copies then folds, each in order; then its sends and receives.
///
/// Within a step, a transport may move the sends and receives in any order and interleave
/// them, with two exceptions it must honour: messages between one pair of ranks keep the
/// order in which the step lists them, and a receive whose local operand (`with`) is memory
/// an earlier receive of the step writes waits for that receive (two children summed into one
/// accumulator). A step's sends never read memory its receives write.
struct step {
  int time = 0;
  std::uint32_t copies_begin = 0, copies_end = 0;
  std::uint32_t folds_begin = 0, folds_end = 0;
  std::uint32_t sends_begin = 0, sends_end = 0;
  std::uint32_t recvs_begin = 0, recvs_end = 0;
};

class schedule {
 public:
  /// Starts a new step at `time` (default: the step after the last one).
  void next_step(int time = -1) {
    low_.reset();
    // A step that only copies (or folds) merges into the next one: its local operations still
    // run before that step's transfers, and it costs no step on the timeline.
    if (!steps_.empty() && steps_.back().sends_begin == steps_.back().sends_end &&
        steps_.back().recvs_begin == steps_.back().recvs_end) {
      if (time >= 0) steps_.back().time = time;
      return;
    }
    if (time < 0) time = steps_.empty() ? 0 : checked_next(steps_.back().time);
    const auto c = std::uint32_t(copies_.size()), f = std::uint32_t(folds_.size()), s = std::uint32_t(sends_.size()),
               r = std::uint32_t(recvs_.size());
    steps_.push_back({time, c, c, f, f, s, s, r, r});
  }
  /// The step at `time`, creating it if the last step is earlier. Steps are appended in time order.
  void at(int time) {
    if (steps_.empty() || steps_.back().time != time) next_step(time);
  }
  void copy(region dst, region src) {
    if (dst == src || dst.count == 0) return;
    ensure_step();
    check_room(copies_.size());
    copies_.push_back({dst, src});
    steps_.back().copies_end = std::uint32_t(copies_.size());
  }
  /// dst = srcs[0] ⊕ srcs[1] ⊕ ... (fold_op), run after this step's copies; `complete`: every
  /// rank's contribution, finalized before its rounding.
  void fold(region dst, std::span<const region> srcs, bool complete = false) {
    if (dst.count == 0) return;
    ensure_step();
    check_room(folds_.size());
    check_room(fold_srcs_.size() + srcs.size());
    const auto b = std::uint32_t(fold_srcs_.size());
    fold_srcs_.insert(fold_srcs_.end(), srcs.begin(), srcs.end());
    folds_.push_back({dst, b, std::uint32_t(fold_srcs_.size()), complete});
    steps_.back().folds_end = std::uint32_t(folds_.size());
  }
  void send(int peer, region src) {
    ensure_step();
    check_room(sends_.size());
    sends_.push_back({peer, src});
    steps_.back().sends_end = std::uint32_t(sends_.size());
  }
  void recv(int peer, region dst, region with = {}, combine how = combine::copy) {
    ensure_step();
    check_room(recvs_.size());
    recvs_.push_back({peer, dst, with, how});
    steps_.back().recvs_end = std::uint32_t(recvs_.size());
  }
  /// Scratch elements the schedule uses (buf::tmp).
  void need_tmp(std::size_t elems) { tmp_ = std::max(tmp_, elems); }
  /// A region the op's finalize (avg: divide by n) applies to at the end.
  void finalize(region r) { finals_.push_back(r); }

  /// Appends `other` after this schedule on the timeline.
  void append(const schedule& other) { append(other, steps_.empty() ? 0 : steps_.back().time + 1); }

  /// Appends `other` with its times shifted by `shift` (which must place it after this schedule)
  /// and its in and out regions moved `offset` elements on (one segment of a larger buffer;
  /// scratch stays where it is).
  void append(const schedule& other, int shift, std::size_t offset = 0) {
    auto at = [offset](region r) {
      if (r.b == buf::in || r.b == buf::out) r.offset += offset;
      return r;
    };
    for (const step& st : other.steps_) {
      next_step(st.time + shift);
      for (auto i = st.copies_begin; i < st.copies_end; ++i) copy(at(other.copies_[i].dst), at(other.copies_[i].src));
      for (auto i = st.folds_begin; i < st.folds_end; ++i) {
        const fold_op& f = other.folds_[i];
        std::vector<region> srcs;
        for (auto j = f.srcs_begin; j < f.srcs_end; ++j) srcs.push_back(at(other.fold_srcs_[j]));
        fold(at(f.dst), srcs, f.complete);
      }
      for (auto i = st.sends_begin; i < st.sends_end; ++i) send(other.sends_[i].peer, at(other.sends_[i].src));
      for (auto i = st.recvs_begin; i < st.recvs_end; ++i) {
        const auto& r = other.recvs_[i];
        recv(r.peer, at(r.dst), r.how == combine::copy ? r.with : at(r.with), r.how);
      }
    }
    need_tmp(other.tmp_);
    for (const region& r : other.finals_) finals_.push_back(at(r));
  }

  const std::vector<step>& steps() const noexcept { return steps_; }
  const std::vector<copy_op>& copies() const noexcept { return copies_; }
  const std::vector<fold_op>& folds() const noexcept { return folds_; }
  const std::vector<region>& fold_srcs() const noexcept { return fold_srcs_; }
  std::span<const region> srcs_of(const fold_op& f) const noexcept {
    return {fold_srcs_.data() + f.srcs_begin, fold_srcs_.data() + f.srcs_end};
  }
  const std::vector<send_op>& sends() const noexcept { return sends_; }
  const std::vector<recv_op>& recvs() const noexcept { return recvs_; }
  const std::vector<region>& finals() const noexcept { return finals_; }
  std::size_t tmp_elems() const noexcept { return tmp_; }
  /// The heap bytes this schedule holds (what a cache of schedules counts).
  std::size_t memory_bytes() const noexcept {
    return sizeof(*this) + steps_.capacity() * sizeof(step) + copies_.capacity() * sizeof(copy_op) +
           folds_.capacity() * sizeof(fold_op) + fold_srcs_.capacity() * sizeof(region) +
           sends_.capacity() * sizeof(send_op) + recvs_.capacity() * sizeof(recv_op) + finals_.capacity() * sizeof(region);
  }
  /// Releases the spare capacity of its arrays (a schedule about to be kept).
  void shrink() {
    steps_.shrink_to_fit();
    copies_.shrink_to_fit();
    folds_.shrink_to_fit();
    fold_srcs_.shrink_to_fit();
    sends_.shrink_to_fit();
    recvs_.shrink_to_fit();
    finals_.shrink_to_fit();
  }

  /// What a transport made of this schedule (a device plan: device/plan.hpp), kept with it so a
  /// cached schedule is lowered once and the lowering is freed with it. `key` tells lowerings
  /// apart (element size, chunk); make() returns a shared_ptr<const X>. A schedule changed
  /// afterwards drops what it kept. Calls on one communicator run one at a time, and its
  /// schedules are its own, so nothing here is shared between threads.
  template <class X, class Make>
  const X& lowered(std::uint64_t key, Make&& make) const {
    return *lowered_shared<X>(key, std::forward<Make>(make));
  }
  /// lowered(), shared: for a transport whose work on it may outlast the call (a kernel still
  /// queued on a stream when the schedule is dropped from its cache).
  template <class X, class Make>
  std::shared_ptr<const X> lowered_shared(std::uint64_t key, Make&& make) const {
    static constexpr char kind = 0;
    if (!low_ || low_key_ != key || low_kind_ != &kind) {
      std::shared_ptr<const X> x = make();
      low_ = x;
      low_key_ = key;
      low_kind_ = &kind;
    }
    return std::static_pointer_cast<const X>(low_);
  }

  /// Time of the last step + 1: this rank's length on the global timeline.
  int span() const noexcept { return steps_.empty() ? 0 : steps_.back().time + 1; }

 private:
  void ensure_step() {
    if (steps_.empty()) next_step(0);
    low_.reset();
  }
  // A schedule's steps index its operations with 32 bits and count time in an int: policies
  // bound their schedules far below (tuning::max_pipeline_chunks, all_reduce's segments), and a
  // schedule that would pass the bounds is an error, never a wrapped index.
  static void check_room(std::size_t n) {
    if (n >= std::size_t(UINT32_MAX)) throw std::length_error("collx: a schedule of more than 2^32 operations");
  }
  static int checked_next(int t) {
    if (t == INT_MAX) throw std::length_error("collx: a schedule longer than 2^31 steps");
    return t + 1;
  }
  std::vector<step> steps_;
  std::vector<copy_op> copies_;
  std::vector<fold_op> folds_;
  std::vector<region> fold_srcs_;
  std::vector<send_op> sends_;
  std::vector<recv_op> recvs_;
  std::vector<region> finals_;
  std::size_t tmp_ = 0;
  mutable std::shared_ptr<const void> low_;  // lowered(): what a transport made of this schedule
  mutable std::uint64_t low_key_ = 0;
  mutable const void* low_kind_ = nullptr;
};

inline const char* to_string(buf b) noexcept {
  switch (b) {
    case buf::in: return "in";
    case buf::out: return "out";
    case buf::tmp: return "tmp";
    default: return "-";
  }
}

inline std::string to_string(const region& r) {
  return std::string(to_string(r.b)) + "[" + std::to_string(r.offset) + "+" + std::to_string(r.count) + "]";
}

/// A human-readable listing of one rank's schedule: one line per operation, prefixed by its step time.
inline std::string describe(const schedule& s) {
  std::string o;
  for (const step& st : s.steps()) {
    const std::string t = "  t" + std::to_string(st.time) + ": ";
    for (auto i = st.copies_begin; i < st.copies_end; ++i)
      o += t + "copy " + to_string(s.copies()[i].src) + " -> " + to_string(s.copies()[i].dst) + "\n";
    for (auto i = st.folds_begin; i < st.folds_end; ++i) {
      const fold_op& f = s.folds()[i];
      o += t + "fold ";
      for (const region& r : s.srcs_of(f)) o += (&r == s.srcs_of(f).data() ? "" : " (+) ") + to_string(r);
      o += " -> " + to_string(f.dst) + "\n";
    }
    for (auto i = st.sends_begin; i < st.sends_end; ++i)
      o += t + "send " + to_string(s.sends()[i].src) + " -> rank " + std::to_string(s.sends()[i].peer) + "\n";
    for (auto i = st.recvs_begin; i < st.recvs_end; ++i) {
      const recv_op& r = s.recvs()[i];
      o += t + "recv rank " + std::to_string(r.peer) + " -> " + to_string(r.dst);
      if (r.how == combine::received_left) o += " = recv (+) " + to_string(r.with);
      if (r.how == combine::received_right) o += " = " + to_string(r.with) + " (+) recv";
      o += "\n";
    }
  }
  return o;
}

}  // namespace collx
