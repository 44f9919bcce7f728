#pragma once
// collx::error and collx::errc: every run-time failure of collx is a collx::error, a
// std::system_error whose code() compares equal to one of the errc values below, so callers write
//   catch (const collx::error& e) { if (e.code() == collx::errc::timeout) ... }
#include <string>
#include <system_error>

namespace collx {

enum class errc {
  timeout = 1,       // a wait passed options::timeout
  mismatch,          // ranks made different calls (collective, count, element size, root, op)
  invalid_argument,  // a bad argument, caught before anything was sent
  peer_lost,         // a peer failed, died or left the communicator
  transport_error,   // the transport itself failed (a system call, a socket)
};

const std::error_category& collx_category() noexcept;

namespace detail {
class collx_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "collx"; }
  std::string message(int c) const override {
    switch (static_cast<errc>(c)) {
      case errc::timeout: return "timeout";
      case errc::mismatch: return "mismatched calls";
      case errc::invalid_argument: return "invalid argument";
      case errc::peer_lost: return "peer lost";
      case errc::transport_error: return "transport error";
    }
    return "unknown collx error";
  }
};
}  // namespace detail

inline const std::error_category& collx_category() noexcept {
  static const detail::collx_category_impl cat;
  return cat;
}

inline std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), collx_category()}; }

/// The one exception type collx throws. what() is the message alone (it names the collective,
/// its sequence number, this rank and the peer); code() compares equal to a collx::errc.
class error : public std::system_error {
 public:
  error(errc e, std::string what) : std::system_error(make_error_code(e)), msg_(std::move(what)) {}
  const char* what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

}  // namespace collx

template <>
struct std::is_error_code_enum<collx::errc> : std::true_type {};
