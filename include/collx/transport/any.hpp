#pragma once
// transport::any: a host transport chosen at run time. It holds any host transport behind one
// virtual call per step, so code that picks its transport from a flag (collx-perf, a launcher
// that reads the environment) instantiates each collective once instead of once per transport.
//   collx::launch_threads<collx::transport::as_any>(n, f);     // communicator<transport::any>
//   collx::launch_processes<collx::transport::as_any>(n, f);
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/concepts.hpp"
#include "../core/error.hpp"
#include "../core/call_info.hpp"
#include "../core/split_plan.hpp"
#include "../core/topology.hpp"

namespace collx::transport {

class any {
 public:
  using transport_concept = transport_tag;
  using memory_space = host_memory;
  static constexpr const char* name = "any";

  template <class T>
    requires(!std::is_same_v<std::decay_t<T>, any> && std::is_same_v<typename std::decay_t<T>::memory_space, host_memory>)
  any(T&& t)  // NOLINT: implicit, so any{inproc{...}} and launch_threads<as_any> read naturally
      : p_(std::make_unique<model<std::decay_t<T>>>(std::forward<T>(t))), flat_(node_map::one_node(p_->size())) {}

  int rank() const noexcept { return p_->rank(); }
  int size() const noexcept { return p_->size(); }
  void exchange(std::span<const send_desc> s, std::span<const recv_desc> r, const exchange_context& c) {
    p_->exchange(s, r, c);
  }
  /// Receive from any source (collectives/p2p.hpp), where the held transport can.
  int probe(std::span<const int> peers, const call_info& call) { return p_->probe(peers, call); }
  void abort(const std::string& why) noexcept { p_->abort(why); }
  void leave() noexcept { p_->leave(); }
  /// The transport's own name ("inproc", "shm", ...).
  const char* kind() const noexcept { return p_->kind(); }
  bool takes_pieces() const noexcept { return p_->takes_pieces(); }
  /// The held transport's position board (the desync report: core/flight_record.hpp), or none.
  detail::position_board positions() const noexcept { return p_->positions(); }
  split_offer prepare_split() { return p_->prepare_split(); }
  any split(const split_plan& p, split_offer&& o) const { return any(p_->split(p, std::move(o))); }
  any shrink(const shrink_request& q, std::vector<int>& members) { return any(p_->shrink(q, members)); }
  /// The held transport's node map (transport::two_level), else one node of every rank.
  const node_map& nodes() const noexcept {
    const node_map* m = p_->nodes();
    return m != nullptr ? *m : flat_;
  }
  /// The held transport's transports within and between nodes (transport::two_level), else none.
  std::pair<const char*, const char*> level_kinds() const noexcept { return p_->level_kinds(); }

 private:
  struct iface {
    virtual ~iface() = default;
    virtual int rank() const noexcept = 0;
    virtual int size() const noexcept = 0;
    virtual void exchange(std::span<const send_desc>, std::span<const recv_desc>, const exchange_context&) = 0;
    virtual int probe(std::span<const int>, const call_info&) = 0;
    virtual void abort(const std::string&) noexcept = 0;
    virtual void leave() noexcept = 0;
    virtual const char* kind() const noexcept = 0;
    virtual bool takes_pieces() const noexcept = 0;
    virtual detail::position_board positions() const noexcept = 0;
    virtual split_offer prepare_split() = 0;
    virtual std::unique_ptr<iface> split(const split_plan&, split_offer&&) = 0;  // (two_level's split its node's transport)
    virtual std::unique_ptr<iface> shrink(const shrink_request&, std::vector<int>&) = 0;
    virtual const node_map* nodes() const noexcept = 0;
    virtual std::pair<const char*, const char*> level_kinds() const noexcept = 0;
  };
  template <class T>
  struct model final : iface {
    T t;
    explicit model(T&& x) : t(std::move(x)) {}
    int rank() const noexcept override { return t.rank(); }
    int size() const noexcept override { return t.size(); }
    void exchange(std::span<const send_desc> s, std::span<const recv_desc> r, const exchange_context& c) override {
      t.exchange(s, r, c);
    }
    int probe(std::span<const int> peers, const call_info& call) override {
      if constexpr (requires { t.probe(peers, call); }) return t.probe(peers, call);
      else call.fail(errc::invalid_argument, std::string("transport ") + T::name + " cannot receive from any source");
    }
    void abort(const std::string& w) noexcept override { t.abort(w); }
    void leave() noexcept override {
      if constexpr (requires { t.leave(); }) t.leave();
    }
    const char* kind() const noexcept override { return T::name; }
    bool takes_pieces() const noexcept override { return detail::takes_pieces(t); }
    detail::position_board positions() const noexcept override {
      if constexpr (requires { t.positions(); }) return t.positions();
      else return {};
    }
    split_offer prepare_split() override {
      if constexpr (requires { t.prepare_split(); }) return t.prepare_split();
      else throw error(errc::invalid_argument, std::string("transport ") + T::name + " cannot split");
    }
    std::unique_ptr<iface> split(const split_plan& p, split_offer&& o) override {
      if constexpr (requires { t.split(p, std::move(o)); }) return std::make_unique<model<T>>(t.split(p, std::move(o)));
      else throw error(errc::invalid_argument, std::string("transport ") + T::name + " cannot split");
    }
    std::unique_ptr<iface> shrink(const shrink_request& q, std::vector<int>& members) override {
      if constexpr (requires { t.shrink(q, members); }) return std::make_unique<model<T>>(t.shrink(q, members));
      else throw error(errc::invalid_argument, q.what + ": transport " + T::name + " cannot shrink");
    }
    const node_map* nodes() const noexcept override {
      if constexpr (requires { t.nodes(); }) return &t.nodes();
      else return nullptr;
    }
    std::pair<const char*, const char*> level_kinds() const noexcept override {
      if constexpr (requires { t.level_kinds(); }) return t.level_kinds();
      else return {nullptr, nullptr};
    }
  };
  explicit any(std::unique_ptr<iface> p) : p_(std::move(p)), flat_(node_map::one_node(p_->size())) {}
  std::unique_ptr<iface> p_;
  node_map flat_;  // nodes() of a transport that has no map
};

/// A decorator for launch_threads / launch_processes that erases the transport's type.
template <class T>
using as_any = any;

}  // namespace collx::transport
