#pragma once
// What transport::tcp puts on the wire, and the parsers that read it back. Everything read from
// a socket passes through one of these functions before any of it is used: each field is
// checked against fixed limits or against what the receiver expects, so bytes from a stranger,
// a bug or a broken connection never size an allocation, index memory or reach a string
// function unchecked. They are pure functions over byte spans, which is what the libFuzzer
// targets (tests/fuzz/) feed with random input.
//
// Byte order is the host's: every rank of a job runs the same build on the same architecture
// (as with NCCL and Gloo); a peer of the other byte order fails the magic check.
//
// Frames
//   hello    connecting rank -> accepting rank, once per connection:
//              magic "CXH1", version, rank, size, nonce[32], 0[32]                (80 bytes)
//   challenge accepting rank -> connecting rank: magic "CXA1", 0, nonce[32], proof[32] (72 bytes)
//            (or, for a hello refused outright, a verdict in its place)
//   proof    connecting rank -> accepting rank: magic "CXA2", 0, proof[32]        (40 bytes)
//            (the exchange and its proofs: tcp/auth.hpp; the secret is never sent)
//   verdict  accepting rank -> connecting rank: magic "CXV1", code (0: admitted)  (8 bytes)
//   message  one per send of a step: a header, then `bytes` of payload
//              magic "CXM1", kind, bytes, the sender's call_signature          (136 bytes)
//            kind data: the payload is the message; bye: the sender leaves the job (no
//            payload); abort: the sender failed, the payload (<= 512 bytes) says why;
//            rts / cts: a synchronous (point-to-point) send asks to send `bytes` (no payload
//            yet), and the receiver, once its receive is there, answers clear-to-send (no
//            payload); only then does the data frame follow.
//   store    request: magic "CXS1", op, key length, value length, key, value
//            reply:   magic "CXT1", status, value length, value
//   position (the desync report: tcp/desync.hpp) on a new connection to a rank's listener:
//            query:  magic "CXQ1", version, rank, size, job hash, nonce[32], mac[32] (88 bytes)
//            answer: magic "CXP1", version, its position on that communicator: seq_state,
//                    waiting_for, name[16], and where it is blocked elsewhere       (88 bytes)
//   shrink   (communicator::shrink: tcp/shrink.hpp) on a new connection to a rank's listener:
//            hello: magic "CXK1", version, rank, size, epoch, 0, job hash, nonce[32], mac[32] (96 bytes),
//            answered by a verdict; then on the survivors' connections, rounds of
//            view:  magic "CXW1", epoch, round, n, n bytes (1: rank alive), where[112]
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../../core/call_info.hpp"

namespace collx::transport::tcp_wire {

constexpr std::uint32_t fourcc(const char (&s)[5]) {
  return std::uint32_t(std::uint8_t(s[0])) | std::uint32_t(std::uint8_t(s[1])) << 8 | std::uint32_t(std::uint8_t(s[2])) << 16 |
         std::uint32_t(std::uint8_t(s[3])) << 24;
}

inline constexpr std::uint32_t kHelloMagic = fourcc("CXH1"), kVerdictMagic = fourcc("CXV1"), kMsgMagic = fourcc("CXM1"),
                               kStoreReqMagic = fourcc("CXS1"), kStoreRepMagic = fourcc("CXT1"),
                               kShrinkHelloMagic = fourcc("CXK1"), kShrinkViewMagic = fourcc("CXW1"),
                               kQueryMagic = fourcc("CXQ1"), kAnswerMagic = fourcc("CXP1"),
                               kChallengeMagic = fourcc("CXA1"), kProofMagic = fourcc("CXA2");
// 2: the call signature carries the entry time (flight recorder); 3: no secret on the wire
// (challenge-response admission, tcp/auth.hpp)
inline constexpr std::uint32_t kVersion = 3;
/// A job secret: up to this many bytes (COLLX_JOB_TOKEN, COLLX_JOB_TOKEN_FILE, or 64 hex digits
/// drawn for the job: tcp/secret.hpp).
inline constexpr std::size_t kTokenBytes = 64;
inline constexpr std::size_t kNonce = 32, kMac = 32;
/// The longest reason an abort frame carries.
inline constexpr std::size_t kMaxAbortReason = 512;

// ---- hello / verdict --------------------------------------------------------------------------

struct hello {
  std::uint32_t magic = kHelloMagic;
  std::uint32_t version = kVersion;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  std::byte nonce[kNonce] = {};
  std::byte reserved[32] = {};
};
static_assert(sizeof(hello) == 80);

/// The accepting rank's answer to a hello it will hear out: its nonce, and its proof that it
/// holds the job's secret (tcp/auth.hpp).
struct challenge {
  std::uint32_t magic = kChallengeMagic;
  std::uint32_t reserved = 0;
  std::byte nonce[kNonce] = {};
  std::byte mac[kMac] = {};
};
static_assert(sizeof(challenge) == 72);

/// The connecting rank's proof, once it has checked the accepting rank's.
struct proof {
  std::uint32_t magic = kProofMagic;
  std::uint32_t reserved = 0;
  std::byte mac[kMac] = {};
};
static_assert(sizeof(proof) == 40);

enum class verdict_code : std::uint32_t {
  admitted = 0, bad_token = 1, bad_rank = 2, duplicate = 3, bad_version = 4, bad_epoch = 5,
  excluded = 6  // after a shrink hello, from its sender: it went on without this rank (tcp/shrink.hpp)
};

struct verdict {
  std::uint32_t magic = kVerdictMagic;
  std::uint32_t code = 0;
};
static_assert(sizeof(verdict) == 8);

inline const char* describe(verdict_code c) {
  switch (c) {
    case verdict_code::admitted: return "admitted";
    case verdict_code::bad_token: return "could not prove it holds the job's secret";
    case verdict_code::bad_rank: return "rank out of range or not expected to connect here";
    case verdict_code::duplicate: return "a connection from that rank already exists";
    case verdict_code::bad_version: return "not a collx peer of this version";
    case verdict_code::bad_epoch: return "another shrink or another communicator (did the ranks call shrink a different number of times?)";
    case verdict_code::excluded: return "the survivors went on without this rank (it joined after their deadline)";
  }
  return "unknown verdict";
}

/// Checks a hello received by `my_rank` of a `my_size`-rank job (the secret is checked after,
/// by the exchange of proofs). Only ranks above this one connect to it (the lower rank accepts).
inline verdict_code check_hello(std::span<const std::byte, sizeof(hello)> raw, int my_rank, int my_size, int& peer) {
  hello h;
  std::memcpy(&h, raw.data(), sizeof h);
  peer = -1;
  if (h.magic != kHelloMagic || h.version != kVersion) return verdict_code::bad_version;
  if (h.size != std::uint32_t(my_size) || h.rank >= std::uint32_t(my_size) || int(h.rank) <= my_rank)
    return verdict_code::bad_rank;
  peer = int(h.rank);
  return verdict_code::admitted;
}

/// The verdict a connecting rank reads back: nullopt when the bytes are not a verdict at all.
inline std::optional<verdict_code> parse_verdict(std::span<const std::byte, sizeof(verdict)> raw) {
  verdict v;
  std::memcpy(&v, raw.data(), sizeof v);
  if (v.magic != kVerdictMagic || v.code > std::uint32_t(verdict_code::excluded)) return std::nullopt;
  return verdict_code(v.code);
}

// ---- position query ---------------------------------------------------------------------------

struct position_query {
  std::uint32_t magic = kQueryMagic;
  std::uint32_t version = kVersion;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  std::uint64_t job = 0;  // hash of the communicator's job name
  std::byte nonce[kNonce] = {};
  std::byte mac[kMac] = {};  // over the fields before it and the asked rank, keyed with the secret
};
static_assert(sizeof(position_query) == 88);

/// Whether a query is for the communicator (job hash `job`, `size` ranks) that `my_rank` is a
/// rank of (its MAC is checked by the caller: tcp/desync.hpp).
inline bool check_query(std::span<const std::byte, sizeof(position_query)> raw, int my_rank, int my_size, std::uint64_t job) {
  position_query q;
  std::memcpy(&q, raw.data(), sizeof q);
  return q.magic == kQueryMagic && q.version == kVersion && q.job == job && q.size == std::uint32_t(my_size) &&
         q.rank < std::uint32_t(my_size) && int(q.rank) != my_rank;
}

struct position_answer {
  std::uint32_t magic = kAnswerMagic;
  std::uint32_t version = kVersion;
  std::uint64_t seq_state = 0;
  std::int32_t waiting_for = -1;
  std::int32_t else_waiting_job = -1;
  char name[16] = {};
  char else_comm[16] = {};
  char else_call[16] = {};
  std::uint64_t else_seq = 0;
  std::uint32_t user = 0;    // detail::position::user: in a call's callbacks, its calls from Python
  std::uint32_t out_ms = 0;  // for how long (ms) it has been in those callbacks, or else out of collx, when not in a call
};
static_assert(sizeof(position_answer) == 88);

/// An answer read back: nullopt when it is not one. Its names come back printable (anything
/// else is replaced), its ranks within [-1, size).
inline std::optional<position_answer> parse_answer(std::span<const std::byte, sizeof(position_answer)> raw, int size) {
  position_answer a;
  std::memcpy(&a, raw.data(), sizeof a);
  if (a.magic != kAnswerMagic || a.version != kVersion) return std::nullopt;
  if (a.waiting_for < -1 || a.waiting_for >= size || a.else_waiting_job < -1) return std::nullopt;
  a.user &= detail::position::kInCallback | detail::position::kPython;
  for (char* f : {a.name, a.else_comm, a.else_call})
    for (int i = 0; i < 16; ++i)
      if (f[i] != 0 && (static_cast<unsigned char>(f[i]) < 32 || static_cast<unsigned char>(f[i]) > 126)) f[i] = '?';
  return a;
}

// ---- shrink -----------------------------------------------------------------------------------

struct shrink_hello {
  std::uint32_t magic = kShrinkHelloMagic;
  std::uint32_t version = kVersion;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  std::uint32_t epoch = 0;
  std::uint32_t reserved = 0;
  std::uint64_t job = 0;  // hash of the communicator's job name: another communicator's shrink is refused
  std::byte nonce[kNonce] = {};
  std::byte mac[kMac] = {};  // over the fields before it and the rank it is sent to, keyed with the secret
};
static_assert(sizeof(shrink_hello) == 96);

/// Checks a shrink hello received by `my_rank` of a `my_size`-rank communicator in shrink
/// `epoch`. Any other rank may connect (each connects to every other).
/// `mac_ok`: its MAC checked out (tcp/shrink.hpp computes it).
inline verdict_code check_shrink_hello(std::span<const std::byte, sizeof(shrink_hello)> raw, int my_rank, int my_size,
                                       std::uint32_t epoch, std::uint64_t job, bool mac_ok, int& peer) {
  shrink_hello h;
  std::memcpy(&h, raw.data(), sizeof h);
  peer = -1;
  if (h.magic != kShrinkHelloMagic || h.version != kVersion) return verdict_code::bad_version;
  if (!mac_ok) return verdict_code::bad_token;
  if (h.size != std::uint32_t(my_size) || h.rank >= std::uint32_t(my_size) || int(h.rank) == my_rank) return verdict_code::bad_rank;
  if (h.epoch != epoch || h.job != job) return verdict_code::bad_epoch;
  peer = int(h.rank);
  return verdict_code::admitted;
}

/// A round of the survivors' agreement: who the sender counts alive, and the address of the
/// listener its new communicator keeps.
inline constexpr std::size_t kShrinkWhere = 112;
struct shrink_view_head {
  std::uint32_t magic = kShrinkViewMagic;
  std::uint32_t epoch = 0;
  std::uint32_t round = 0;
  std::uint32_t n = 0;
};
inline std::size_t shrink_view_bytes(int n) { return sizeof(shrink_view_head) + std::size_t(n) + kShrinkWhere; }

/// Parses a view frame of shrink_view_bytes(n) bytes for (epoch, round): false, with `why`, when
/// it is not one; else `alive` gets its n flags and `where` its address.
inline bool parse_shrink_view(std::span<const std::byte> raw, std::uint32_t epoch, std::uint32_t round, int n,
                              std::vector<char>& alive, std::string& where, std::string& why) {
  shrink_view_head h;
  if (n < 1 || raw.size() != shrink_view_bytes(n)) {
    why = "a view frame of the wrong size";
    return false;
  }
  std::memcpy(&h, raw.data(), sizeof h);
  if (h.magic != kShrinkViewMagic) {
    why = "not a shrink view (bad magic)";
    return false;
  }
  if (h.epoch != epoch || h.round != round || h.n != std::uint32_t(n)) {
    why = "a view of another shrink or round (epoch " + std::to_string(h.epoch) + ", round " + std::to_string(h.round) + ")";
    return false;
  }
  alive.assign(std::size_t(n), 0);
  for (int r = 0; r < n; ++r) {
    const auto f = static_cast<unsigned char>(raw[sizeof h + std::size_t(r)]);
    if (f > 1) {
      why = "a view flag that is neither 0 nor 1";
      return false;
    }
    alive[std::size_t(r)] = char(f);
  }
  const char* w = reinterpret_cast<const char*>(raw.data() + sizeof h + std::size_t(n));
  const std::size_t len = strnlen(w, kShrinkWhere);
  if (len == 0 || len == kShrinkWhere) {
    why = "a view without an address";
    return false;
  }
  for (std::size_t i = 0; i < len; ++i)
    if (static_cast<unsigned char>(w[i]) < 33 || static_cast<unsigned char>(w[i]) > 126) {
      why = "a view whose address is not printable";
      return false;
    }
  where.assign(w, len);
  return true;
}

// ---- message header ---------------------------------------------------------------------------

enum class msg_kind : std::uint32_t { data = 1, bye = 2, abort = 3, rts = 4, cts = 5 };

struct msg_header {
  std::uint32_t magic = kMsgMagic;
  std::uint32_t kind = std::uint32_t(msg_kind::data);
  std::uint64_t bytes = 0;
  call_signature sig;
};
static_assert(sizeof(msg_header) == 136);

/// A header after parse_header(): the fields are safe to use (strings terminated, sizes bounded
/// where the kind bounds them).
struct parsed_header {
  msg_kind kind = msg_kind::data;
  std::uint64_t bytes = 0;
  call_signature sig;
};

/// Parses a message header. nullopt with `why` set when it is not a valid header.
inline std::optional<parsed_header> parse_header(std::span<const std::byte, sizeof(msg_header)> raw, std::string& why) {
  msg_header h;
  std::memcpy(&h, raw.data(), sizeof h);
  if (h.magic != kMsgMagic) {
    why = "not a collx message (bad magic)";
    return std::nullopt;
  }
  if (h.kind < 1 || h.kind > 5) {
    why = "unknown message kind " + std::to_string(h.kind);
    return std::nullopt;
  }
  parsed_header p;
  p.kind = msg_kind(h.kind);
  p.bytes = h.bytes;
  if (p.kind == msg_kind::bye && p.bytes != 0) {
    why = "a farewell with a payload";
    return std::nullopt;
  }
  if (p.kind == msg_kind::cts && p.bytes != 0) {
    why = "a clear-to-send with a payload";
    return std::nullopt;
  }
  if (p.kind == msg_kind::abort && p.bytes > kMaxAbortReason) {
    why = "an abort reason of " + std::to_string(p.bytes) + " B (at most " + std::to_string(kMaxAbortReason) + ")";
    return std::nullopt;
  }
  p.sig = h.sig;
  // Names are fixed arrays: terminate them, so describe() and strncmp never read past them.
  p.sig.collective[sizeof p.sig.collective - 1] = 0;
  p.sig.policy[sizeof p.sig.policy - 1] = 0;
  p.sig.op[sizeof p.sig.op - 1] = 0;
  return p;
}

/// An abort frame's reason as messages show it: control characters but newlines become '?'.
inline std::string printable_reason(std::string why) {
  for (char& c : why)
    if (static_cast<unsigned char>(c) < 32 && c != '\n') c = '?';
  return why;
}

/// The length of the reason of an abort frame whose header is at the head of connected socket
/// `f`, looked at without taking anything from it (MSG_PEEK): a peer that failed said why
/// before it closed. nullopt when the stream starts with anything else, or less than a header
/// has come.
/// `peek(buf, n)` looks at the stream's first n bytes without taking them (recv's MSG_PEEK, or
/// a TLS channel's: tcp/stream.hpp) and returns how many it could.
template <class Peek>
std::optional<std::size_t> abort_at_head_with(Peek&& peek) {
  msg_header h;
  if (peek(&h, sizeof h) != ssize_t(sizeof h) || h.magic != kMsgMagic || h.kind != std::uint32_t(msg_kind::abort) ||
      h.bytes > kMaxAbortReason)
    return std::nullopt;
  return std::size_t(h.bytes);
}
inline std::optional<std::size_t> abort_at_head(int f) {
  return abort_at_head_with([f](void* b, std::size_t n) { return ::recv(f, b, n, MSG_PEEK | MSG_DONTWAIT); });
}

/// The reason of an abort frame at the head of connected socket `f`, taking nothing from it;
/// nullopt as abort_at_head, or when the reason has not all come.
inline std::optional<std::string> peek_abort(int f) {
  const auto n = abort_at_head(f);
  if (!n) return std::nullopt;
  std::byte b[sizeof(msg_header) + kMaxAbortReason];
  if (::recv(f, b, sizeof(msg_header) + *n, MSG_PEEK | MSG_DONTWAIT) != ssize_t(sizeof(msg_header) + *n)) return std::nullopt;
  return printable_reason(std::string(reinterpret_cast<const char*>(b) + sizeof(msg_header), *n));
}

// ---- store protocol ---------------------------------------------------------------------------

// auth_begin: the client's nonce (32 B), answered by the server's nonce and proof (64 B); auth:
// the client's proof (32 B) (tcp/auth.hpp)
enum class store_op : std::uint8_t { auth = 1, set = 2, get = 3, add = 4, auth_begin = 5 };
enum class store_status : std::uint32_t { ok = 0, denied = 1, bad_request = 2 };

inline constexpr std::size_t kMaxKey = 256;
inline constexpr std::size_t kMaxValue = 4096;

struct store_req_header {
  std::uint32_t magic = kStoreReqMagic;
  std::uint8_t op = 0;
  std::uint8_t pad[3] = {};
  std::uint32_t key_len = 0;
  std::uint32_t value_len = 0;
};
static_assert(sizeof(store_req_header) == 16);

struct store_rep_header {
  std::uint32_t magic = kStoreRepMagic;
  std::uint32_t status = 0;
  std::uint32_t value_len = 0;
  std::uint32_t pad = 0;
};
static_assert(sizeof(store_rep_header) == 16);

struct store_request {
  store_op op = store_op::get;
  std::string key, value;
};

/// Result of parsing the front of a byte stream: a whole request (and how many bytes it took),
/// a need for more bytes, or garbage (the connection is then dropped).
struct store_parse {
  enum class status { need_more, ok, bad } st = status::need_more;
  std::size_t consumed = 0;
  store_request req;
  std::string why;
};

inline store_parse parse_store_request(std::span<const std::byte> in) {
  store_parse r;
  if (in.size() < sizeof(store_req_header)) return r;
  store_req_header h;
  std::memcpy(&h, in.data(), sizeof h);
  auto bad = [&](std::string why) {
    r.st = store_parse::status::bad;
    r.why = std::move(why);
    return r;
  };
  if (h.magic != kStoreReqMagic) return bad("not a collx store request (bad magic)");
  if (h.op < 1 || h.op > 5) return bad("unknown store operation " + std::to_string(h.op));
  if (h.key_len == 0 || h.key_len > kMaxKey) return bad("key of " + std::to_string(h.key_len) + " B (1.." + std::to_string(kMaxKey) + ")");
  if (h.value_len > kMaxValue) return bad("value of " + std::to_string(h.value_len) + " B (at most " + std::to_string(kMaxValue) + ")");
  if (store_op(h.op) == store_op::add && h.value_len != 8) return bad("add takes an 8-byte increment");
  if ((store_op(h.op) == store_op::auth || store_op(h.op) == store_op::auth_begin) && h.value_len != 32)
    return bad("a login step carries 32 bytes");
  const std::size_t need = sizeof h + std::size_t(h.key_len) + std::size_t(h.value_len);
  if (in.size() < need) return r;
  r.st = store_parse::status::ok;
  r.consumed = need;
  r.req.op = store_op(h.op);
  const char* p = reinterpret_cast<const char*>(in.data()) + sizeof h;
  r.req.key.assign(p, h.key_len);
  r.req.value.assign(p + h.key_len, h.value_len);
  return r;
}

inline std::string encode_store_request(store_op op, std::string_view key, std::string_view value) {
  store_req_header h;
  h.op = std::uint8_t(op);
  h.key_len = std::uint32_t(key.size());
  h.value_len = std::uint32_t(value.size());
  std::string s(sizeof h, '\0');
  std::memcpy(s.data(), &h, sizeof h);
  s.append(key);
  s.append(value);
  return s;
}

inline std::string encode_store_reply(store_status st, std::string_view value) {
  store_rep_header h;
  h.status = std::uint32_t(st);
  h.value_len = std::uint32_t(value.size());
  std::string s(sizeof h, '\0');
  std::memcpy(s.data(), &h, sizeof h);
  s.append(value);
  return s;
}

/// Checks a reply header: nullopt when it is not one (or announces more than kMaxValue bytes).
inline std::optional<store_rep_header> parse_store_reply(std::span<const std::byte, sizeof(store_rep_header)> raw) {
  store_rep_header h;
  std::memcpy(&h, raw.data(), sizeof h);
  if (h.magic != kStoreRepMagic || h.status > 2 || h.value_len > kMaxValue) return std::nullopt;
  return h;
}

}  // namespace collx::transport::tcp_wire
