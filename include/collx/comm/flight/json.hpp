#pragma once
// The flight recorder as JSON: a communicator's record, and a job rank's dump document. Part of comm/flight.hpp, which includes it
// after the recorder; include comm/flight.hpp, not this file.

namespace collx {

namespace detail {

inline void json_string(std::string& o, std::string_view s) {
  o += '"';
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          o += b;
        } else {
          o += c;
        }
    }
  }
  o += '"';
}

/// One communicator as a JSON object (what flight::json returns, and a dump lists).
inline std::string flight_recorder::json() const {
  std::lock_guard g(mu_);
  std::string o = "{\"name\":";
  json_string(o, id_ == nullptr || id_->is_job() ? std::string("world") : id_->name);
  o += ",\"transport\":";
  json_string(o, transport_ == nullptr ? "" : transport_);
  o += ",\"rank\":" + std::to_string(rank_) + ",\"size\":" + std::to_string(size_) + ",\"job_ranks\":[";
  for (int r = 0; r < size_; ++r) o += (r ? "," : "") + std::to_string(id_ == nullptr ? r : id_->job_rank(r));
  o += "],\"calls_total\":" + std::to_string(next_) + ",\"capacity\":" + std::to_string(cap());
  // Where this rank is now outside collx: in the continuations (callbacks) of a call's work
  // since in_callback_since_ns (0: not), its calls from Python or not
  o += ",\"in_callback_since_ns\":" + std::to_string(user_since_.load(std::memory_order_relaxed)) + ",\"caller\":\"" +
       (caller_language.load(std::memory_order_relaxed) & position::kPython ? "Python" : "C++") + "\"";
  o += ",\"waits\":{\"calls\":" + std::to_string(cum_.calls) + ",\"busy_ns\":" + std::to_string(cum_.busy_ns) + ",\"waited_ns\":[";
  for (std::size_t p = 0; p < cum_.waited_ns.size(); ++p) o += (p ? "," : "") + std::to_string(cum_.waited_ns[p]);
  o += "],\"late_ns\":[";
  for (std::size_t p = 0; p < cum_.late_ns.size(); ++p) o += (p ? "," : "") + std::to_string(cum_.late_ns[p]);
  o += "]},\"calls\":[";
  const std::uint64_t first = next_ > cap() ? next_ - cap() : 0;
  for (std::uint64_t i = first; i < next_; ++i) {
    const flight_entry e = snapshot(i);
    if (i != first) o += ",";
    o += "{\"index\":" + std::to_string(e.index) + ",\"seq\":" + std::to_string(e.sig.seq) + ",\"collective\":";
    json_string(o, sig_text(e.sig.collective, sizeof e.sig.collective));
    o += ",\"policy\":";
    json_string(o, sig_text(e.sig.policy, sizeof e.sig.policy));
    o += ",\"op\":";
    json_string(o, sig_text(e.sig.op, sizeof e.sig.op));
    o += ",\"count\":" + std::to_string(e.sig.count) + ",\"elem_size\":" + std::to_string(e.sig.elem_size) +
         ",\"root\":" + std::to_string(e.sig.root) + ",\"state\":\"" + to_string(e.state) +
         "\",\"issued_ns\":" + std::to_string(e.issued_ns) + ",\"start_ns\":" + std::to_string(e.start_ns) +
         ",\"end_ns\":" + std::to_string(e.end_ns) + ",\"waited_ns\":" + std::to_string(e.waited_ns) +
         ",\"waiting_for\":" + std::to_string(e.waiting_for) + ",\"peers\":[";
    for (int k = 0; k < e.n_peers; ++k) {
      const peer_wait& w = e.peers[std::size_t(k)];
      o += std::string(k ? "," : "") + "{\"peer\":" + std::to_string(w.peer) + ",\"waited_ns\":" + std::to_string(w.waited_ns) +
           ",\"late_ns\":" + std::to_string(w.late_ns) + "}";
    }
    o += "]";
    if (e.state == call_state::failed) {
      o += ",\"code\":" + std::to_string(e.code) + ",\"error\":";
      json_string(o, e.error);
    }
    o += "}";
  }
  return o + "]}";
}

/// Every communicator of job rank `job_rank` in this process, as one JSON document.
inline std::string job_rank_json(int job_rank, const char* reason) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string o = "{\"collx_flight_recorder\":1,\"job_rank\":" + std::to_string(job_rank) + ",\"host\":";
  json_string(o, host);
  o += ",\"pid\":" + std::to_string(::getpid()) + ",\"time_ns\":" + std::to_string(wall_ns()) + ",\"reason\":";
  json_string(o, reason);
  o += ",\"communicators\":[";
  auto& r = flight_recorders();
  std::lock_guard g(r.mu);
  bool first = true;
  for (const flight_recorder* f : r.all) {
    if (f->job_rank() != job_rank || !f->enabled()) continue;
    if (!first) o += ",";
    first = false;
    o += f->json();
  }
  return o + "]}\n";
}

}  // namespace detail

}  // namespace collx
