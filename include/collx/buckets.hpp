#pragma once
// collx::bucket_reducer: DDP's gradient buckets. It takes a model's gradient buffers in the order
// the forward pass created them, groups them in reverse order (backward produces them last layer
// first) into buckets of at most `cap_bytes` (25 MiB by default; the first bucket, the one that
// completes first, at most `first_cap_bytes`, 1 MiB: it starts communication early), and for
// each training step:
//
//   collx::bucket_reducer<decltype(comm)::transport_type, float> r(comm, grads);  // once
//   ... backward: as each gradient is produced
//   r.ready(i);       // copies gradient i into its bucket; a complete bucket starts its all_reduce
//   r.finish();       // waits for every bucket and leaves the reduced gradients in place
//
// Buckets start in bucket order, whatever order the gradients come in, so every rank issues the
// same calls in the same order (as DDP does); a bucket that completes early waits for the ones
// before it. A gradient larger than the cap has a bucket of its own. The reduction is avg by
// default (the gradient of the global batch), any op and element type otherwise.
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "async.hpp"

namespace collx {

struct bucket_options {
  std::size_t cap_bytes = std::size_t(25) << 20;
  std::size_t first_cap_bytes = std::size_t(1) << 20;
};

template <class T, class E, class Op = ops::avg, class Algo = algo::automatic>
class bucket_reducer {
  static_assert(detail::check_reducing<E, Op, Algo>());

 public:
  bucket_reducer(communicator<T>& comm, std::vector<std::span<E>> grads, bucket_options o = {}, Op op = {}, Algo a = {})
      : comm_(&comm), grads_(std::move(grads)), op_(op), algo_(a), where_(grads_.size()) {
    if (o.cap_bytes == 0 || o.first_cap_bytes == 0) throw error(errc::invalid_argument, "bucket_reducer: a cap of 0 bytes");
    // Reverse order of creation: the order backward produces them.
    auto cap_of = [&](std::size_t b) { return b == 0 ? o.first_cap_bytes : o.cap_bytes; };
    for (std::size_t k = grads_.size(); k-- > 0;) {
      const std::size_t bytes = grads_[k].size_bytes();
      if (buckets_.empty() || (bytes != 0 && buckets_.back().count != 0 &&
                               buckets_.back().count * sizeof(E) + bytes > cap_of(buckets_.size() - 1)))
        buckets_.emplace_back();
      bucket& b = buckets_.back();
      where_[k] = {buckets_.size() - 1, b.count};
      b.grads.push_back(k);
      b.count += grads_[k].size();
    }
    for (auto& x : buckets_) {
      x.data.resize(x.count);
      x.pending = x.grads.size();
    }
  }

  /// Gradient i holds this step's value: it is copied into its bucket, and every bucket that is
  /// complete, and has only complete buckets before it, starts its all_reduce.
  void ready(std::size_t i) {
    if (i >= grads_.size())
      throw error(errc::invalid_argument, "bucket_reducer: gradient " + std::to_string(i) + " of " + std::to_string(grads_.size()));
    auto [b, off] = where_[i];
    bucket& x = buckets_[b];
    if (marked(i)) throw error(errc::invalid_argument, "bucket_reducer: gradient " + std::to_string(i) + " marked ready twice in one step");
    mark(i);
    if (!grads_[i].empty()) std::memcpy(x.data.data() + off, grads_[i].data(), grads_[i].size_bytes());
    --x.pending;
    while (next_ < buckets_.size() && buckets_[next_].pending == 0) launch(next_++);
  }

  /// Waits for every bucket and copies the reduced gradients back; the next step starts afresh.
  /// Every gradient must have been marked ready.
  void finish() {
    std::string missing;
    for (std::size_t i = 0; i < grads_.size(); ++i)
      if (!marked(i)) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
    if (!missing.empty()) {
      for (auto& x : buckets_) x.w.wait();  // what did start finishes before the error
      throw error(errc::invalid_argument, "bucket_reducer: finish() before gradient(s) " + missing + " were marked ready");
    }
    for (auto& x : buckets_) x.w.wait();
    for (auto& x : buckets_) {
      std::size_t off = 0;
      for (std::size_t k : x.grads) {
        if (!grads_[k].empty()) std::memcpy(grads_[k].data(), x.data.data() + off, grads_[k].size_bytes());
        off += grads_[k].size();
      }
      x.pending = x.grads.size();
      x.w = work{};
    }
    std::fill(ready_.begin(), ready_.end(), false);
    next_ = 0;
  }

  /// The gradients of each bucket, in the order they fill it (for docs and tests).
  std::vector<std::vector<std::size_t>> assignment() const {
    std::vector<std::vector<std::size_t>> a;
    for (const auto& x : buckets_) a.push_back(x.grads);
    return a;
  }
  std::size_t buckets() const noexcept { return buckets_.size(); }

 private:
  struct bucket {
    std::vector<std::size_t> grads;  // gradient indices, in order of arrival in backward
    std::size_t count = 0;           // elements
    std::vector<E> data;
    std::size_t pending = 0;
    work w;
  };
  bool marked(std::size_t i) const { return !ready_.empty() && ready_[i]; }
  void mark(std::size_t i) {
    if (ready_.empty()) ready_.assign(grads_.size(), false);
    ready_[i] = true;
  }
  void launch(std::size_t b) { buckets_[b].w = async::all_reduce(*comm_, std::span<E>(buckets_[b].data), op_, algo_); }

  communicator<T>* comm_;
  std::vector<std::span<E>> grads_;
  Op op_;
  Algo algo_;
  std::vector<std::pair<std::size_t, std::size_t>> where_;  // per gradient: bucket, offset
  std::vector<bucket> buckets_;
  std::vector<bool> ready_;
  std::size_t next_ = 0;  // the next bucket to start
};

}  // namespace collx
