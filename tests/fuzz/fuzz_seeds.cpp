// Writes valid frames into the fuzz targets' corpus directories, so fuzzing starts from inputs
// that pass the magic checks and goes on to the fields behind them.
//   fuzz_seeds <corpus_fuzz_wire> <corpus_fuzz_store>
#include <collx/transport/tcp/wire.hpp>

#include <fstream>
#include <string>

namespace w = collx::transport::tcp_wire;

static void put(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}
template <class T>
static std::string raw(const T& x) {
  return std::string(reinterpret_cast<const char*>(&x), sizeof x);
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  w::msg_header h;
  h.bytes = 4000;
  std::strcpy(h.sig.collective, "all_reduce");
  std::strcpy(h.sig.policy, "ring");
  h.sig.count = 1000;
  h.sig.elem_size = 4;
  w::hello he;
  he.rank = 2;
  he.size = 4;
  put(argv[1], "data", raw(h) + raw(he));
  h.kind = std::uint32_t(w::msg_kind::abort);
  h.bytes = 12;
  put(argv[1], "abort", raw(h) + "it failed...");
  w::verdict v;
  w::store_rep_header r;
  put(argv[1], "verdict", raw(v) + raw(r) + std::string(120, '\0'));
  const std::string token = std::string(1, '\1') + std::string(1, '\7');  // token, pieces of 8
  // a login (its proof cannot be right: the server's nonce is fresh), then requests
  put(argv[2], "session", token + w::encode_store_request(w::store_op::auth_begin, "auth", std::string(32, 'n')) +
                              w::encode_store_request(w::store_op::auth, "auth", std::string(32, 'p')) +
                              w::encode_store_request(w::store_op::set, "job/addr/0", "127.0.0.1:5000 host 0,") +
                              w::encode_store_request(w::store_op::get, "job/addr/0", "") +
                              w::encode_store_request(w::store_op::add, "job/ready", std::string(8, '\1')) +
                              w::encode_store_request(w::store_op::get, "job/never", ""));
  put(argv[2], "open", std::string(1, '\0') + std::string(1, '\7') +  // a store without a secret
                           w::encode_store_request(w::store_op::set, "job/addr/0", "127.0.0.1:5000 host 0,") +
                           w::encode_store_request(w::store_op::get, "job/addr/0", ""));
  return 0;
}
