#pragma once
// collx::bucket_reducer: DDP's gradient buckets. It takes a model's gradient buffers in the order
// the forward pass created them, groups them in reverse order (backward produces them last layer
// first) into buckets of at most `cap_bytes` (25 MiB by default; the first bucket, the one that
// completes first, at most `first_cap_bytes`, 1 MiB: it starts communication early), and for
// each training step:
//
//   collx::bucket_reducer r(comm, grads);   // once; grads: std::vector<std::span<float>>
//   ... backward: as each gradient is produced
//   r.ready(i);       // copies gradient i into its bucket; a complete bucket starts its all_reduce
//   r.finish();       // waits for every bucket and leaves the reduced gradients in place
//
// Buckets start in bucket order, whatever order the gradients come in, so every rank issues the
// same calls in the same order (as DDP does); a bucket that completes early waits for the ones
// before it. A gradient larger than the cap has a bucket of its own. The reduction is avg by
// default (the gradient of the global batch), any op and element type otherwise. The copy back
// into the gradients is part of each bucket's nonblocking call, so it overlaps backward as well.
// The reducer must not move while a step is in flight (its buckets are referred to by address).
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
      : comm_(&comm), grads_(std::move(grads)), op_(op), algo_(a), where_(grads_.size()), ready_(grads_.size(), false) {
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

  // Its calls in flight refer to its buckets and gradients by address.
  bucket_reducer(const bucket_reducer&) = delete;
  bucket_reducer& operator=(const bucket_reducer&) = delete;

  /// Gradient i holds this step's value: it is copied into its bucket, and every bucket that is
  /// complete, and has only complete buckets before it, starts its all_reduce.
  void ready(std::size_t i) {
    if (i >= grads_.size())
      throw error(errc::invalid_argument, "bucket_reducer: gradient " + std::to_string(i) + " of " + std::to_string(grads_.size()));
    auto [b, off] = where_[i];
    bucket& x = buckets_[b];
    if (ready_[i]) throw error(errc::invalid_argument, "bucket_reducer: gradient " + std::to_string(i) + " marked ready twice in one step");
    ready_[i] = true;
    if (!grads_[i].empty() && grads_[i].data() != x.data.data() + off)  // a view of the bucket needs no copy
      std::memcpy(x.data.data() + off, grads_[i].data(), grads_[i].size_bytes());
    --x.pending;
    while (next_ < buckets_.size() && buckets_[next_].pending == 0) launch(next_++);
  }

  /// Waits for every bucket and copies the reduced gradients back; the next step starts afresh.
  /// Every gradient must have been marked ready.
  void finish() {
    std::string missing;
    for (std::size_t i = 0; i < grads_.size(); ++i)
      if (!ready_[i]) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
    // What did start finishes either way, and the next step starts afresh.
    for (auto& x : buckets_) {
      x.w.wait();  // the call copied the reduced gradients back too
      x.pending = x.grads.size();
      x.w = work{};
    }
    std::fill(ready_.begin(), ready_.end(), false);
    next_ = 0;
    if (!missing.empty())
      throw error(errc::invalid_argument, "bucket_reducer: finish() before gradient(s) " + missing +
                                              " were marked ready (the step is dropped; the next starts afresh)");
  }

  /// Gradient i's place in its bucket (DDP's gradient_as_bucket_view): a backward pass that
  /// writes gradient i there, and passes these spans as the gradients (rebind), saves both
  /// copies.
  std::span<E> bucket_view(std::size_t i) {
    auto [b, off] = where_.at(i);
    return std::span<E>(buckets_[b].data.data() + off, grads_[i].size());
  }
  /// Makes the buckets' own memory the gradients: after it, gradient i is bucket_view(i).
  void rebind_to_views() {
    for (std::size_t i = 0; i < grads_.size(); ++i) grads_[i] = bucket_view(i);
  }
  std::span<E> gradient(std::size_t i) const { return grads_.at(i); }

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
  /// The bucket's all_reduce, then the copy of its reduced gradients back into place: both in
  /// the nonblocking call, so the copy overlaps what backward has left to do too.
  void launch(std::size_t b) {
    bucket* x = &buckets_[b];
    const std::vector<std::span<E>>* grads = &grads_;
    buckets_[b].w = async::run(*comm_, [x, grads, op = op_, algo = algo_](communicator<T>& c) {
      collx::all_reduce(c, std::span<E>(x->data), op, algo);
      std::size_t off = 0;
      for (std::size_t k : x->grads) {
        const std::span<E> g = (*grads)[k];
        if (!g.empty() && g.data() != x->data.data() + off) std::memcpy(g.data(), x->data.data() + off, g.size_bytes());
        off += g.size();
      }
    });
  }

  communicator<T>* comm_;
  std::vector<std::span<E>> grads_;
  Op op_;
  Algo algo_;
  std::vector<std::pair<std::size_t, std::size_t>> where_;  // per gradient: bucket, offset
  std::vector<bucket> buckets_;
  std::vector<bool> ready_;
  std::size_t next_ = 0;  // the next bucket to start
};

template <class T, class E>
bucket_reducer(communicator<T>&, std::vector<std::span<E>>) -> bucket_reducer<T, E>;
template <class T, class E>
bucket_reducer(communicator<T>&, std::vector<std::span<E>>, bucket_options) -> bucket_reducer<T, E>;
template <class T, class E, class Op>
bucket_reducer(communicator<T>&, std::vector<std::span<E>>, bucket_options, Op) -> bucket_reducer<T, E, Op>;

}  // namespace collx
