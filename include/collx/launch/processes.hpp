#pragma once
// launch_processes(n, f, options[, config]): forks n processes, each a rank over
// transport::shm (or transport::tcp when given a tcp_config: rank 0 serves the rendezvous store
// on a loopback socket the parent opened), runs f(comm) in each, waits for all of them and
// reports every child's failure: an exception (its collx::errc and message travel back through
// a pipe), a non-zero exit, or a signal. Throws collx::error when any rank failed, naming each.
// Meant for tests, examples and benchmarks; a real job is started by its launcher (mpirun,
// srun, torchrun) and uses shm::from_env() or tcp::from_env().
// Once a rank has failed, the others get min(options::timeout, 10 s) + 1 s to report; a rank still
// running then is killed and named; so is a rank stopped by a signal (SIGSTOP, SIGTSTP) that is
// still stopped that long after every other rank has ended. Call it from a process with one thread running (or one
// launcher at a time): a child of fork() has only the forking thread, and a lock another thread
// held at that moment (the allocator's under ASan, whose runtime takes none around fork) is held
// in the child for ever.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../comm/communicator.hpp"
#include "threads.hpp"
#include "../core/error.hpp"
#include "../transport/shm.hpp"
#include "../transport/tcp.hpp"

namespace collx {

namespace detail {

/// What one rank of a job reported: its errc (as a number), its message, and whether it died
/// (a signal or an exit status: no message of its own).
struct rank_failure {
  int rank;
  int code;
  std::string what;
  bool died = false;
};

/// The one error a launcher throws for a job whose ranks failed (`failures` by rank, n ranks):
/// the cause's message, then which ranks failed.
/// The cause: an error of a rank's own (not peer_lost), else a rank that died, else the first.
/// A timeout names the rank it waited for; when that rank was waiting too (it timed out as
/// well, or the job was aborted while it waited: the first timeout aborts the job, and a rank
/// whose deadline was a moment later reports the abort), the rank it waited for is nearer the
/// cause (a stopped rank stalls its neighbour, which stalls the next): the chain is followed, at
/// most n hops, and the error stays a timeout. (CI's ASan run at fba056e: rank 1 timed out
/// waiting for rank 0, rank 0 reported the abort while it waited for the late rank 2, and the
/// job's error named rank 0 instead of rank 2.)
inline error job_failure(const std::vector<rank_failure>& failures, int n) {
  const rank_failure* cause = &failures.front();
  for (const auto& x : failures)
    if (x.died) { cause = &x; break; }
  for (const auto& x : failures)
    if (x.code != int(errc::peer_lost)) { cause = &x; break; }
  const int code = cause->code;
  auto waiting = [](const rank_failure& x) { return x.code == int(errc::timeout) || call_info::aborted_wait(x.what); };
  for (int hop = 0; hop < n && code == int(errc::timeout) && waiting(*cause); ++hop) {
    const int peer = call_info::waited_for(cause->what);
    const rank_failure* next = nullptr;
    for (const auto& x : failures)
      if (x.rank == peer && waiting(x)) next = &x;
    if (next == nullptr || next == cause) break;
    cause = next;
  }
  std::string all = cause->what;
  if (failures.size() > 1) {
    all += " [" + std::to_string(failures.size()) + " ranks failed:";
    for (const auto& x : failures) all += " " + std::to_string(x.rank);
    all += "]";
  }
  return error(code >= int(errc::timeout) && code <= int(errc::transport_error) ? errc(code) : errc::peer_lost, all);
}

inline std::string unique_job_name() {
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  return "lp" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" + std::to_string(rd() % 1000000);
}

inline void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t k = ::write(fd, s.data() + off, s.size() - off);
    if (k <= 0) return;
    off += std::size_t(k);
  }
}

/// The fork/report machinery; make(job, rank) builds a rank's transport in its child; forked() runs in
/// the parent once every child exists (to drop what only the children need).
template <template <class> class Decorator, class Make, class F, class Forked = void (*)()>
void launch_processes_with(int n, const std::string& job, Make&& make, F&& f, const options& opts, Forked forked = [] {}) {
  using transport_t = Decorator<std::invoke_result_t<Make&, const std::string&, int>>;
  // Rank r is pinned to the r-th usable core, round robin: one rank per core when they fit, as
  // mpirun binds by default (ranks that wait for each other then never share a core while
  // another idles; fresh processes start on their parent's core). When ranks outnumber cores
  // they are spread evenly too: left to the scheduler, 4 processes on 2 cores are now and then
  // packed 3 + 1 or migrated mid-run, and a collective runs at the pace of the crowded core.
  // 4 processes on 2 cores, all_to_all of 256 KiB, 5 alternating runs,
  // `collx-perf --transport shm -np 4 --op all_to_all -b 64K -e 1M -f 4 -n 300`: unpinned
  // 35-78 us (bimodal), pinned 2 + 2 (any pairing) 35-37 us; all_reduce 8 B 2.4-5.0 vs 2.6-3.3 us.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  const bool pin = !cpus.empty();
  std::vector<pid_t> pids(std::size_t(n), -1);
  std::vector<int> fds(std::size_t(n), -1);
  std::fflush(nullptr);  // children must not flush the parent's buffered output again
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (pipe(p) != 0) throw error(errc::transport_error, std::string("launch_processes: pipe: ") + std::strerror(errno));
    const pid_t pid = fork();
    if (pid < 0) {
      close(p[0]);
      close(p[1]);
      for (int q = 0; q < r; ++q) kill(pids[std::size_t(q)], SIGKILL);
      for (int q = 0; q < r; ++q) waitpid(pids[std::size_t(q)], nullptr, 0);
      throw error(errc::transport_error, std::string("launch_processes: fork: ") + std::strerror(errno));
    }
    if (pid == 0) {  // the child: one rank
      close(p[0]);
      if (pin) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[std::size_t(r) % cpus.size()], &one);
        sched_setaffinity(0, sizeof one, &one);
      }
      for (int q = 0; q < r; ++q) close(fds[std::size_t(q)]);
      int code = 0;
      try {
        communicator<transport_t> comm{transport_t{make(job, r)}, opts};
        try {
          f(comm);
        } catch (const std::exception& e) {  // fail the job, so peers stop waiting for this rank
          comm.transport().abort(e.what());
          throw;
        } catch (...) {
          comm.transport().abort("unknown exception");
          throw;
        }
        comm.transport().leave();
      } catch (const error& e) {
        detail::write_all(p[1], std::to_string(e.code().value()) + "\n" + e.what());
        code = 1;
      } catch (const std::exception& e) {
        detail::write_all(p[1], "0\n" + std::string(e.what()));
        code = 1;
      } catch (...) {
        detail::write_all(p[1], "0\nunknown exception");
        code = 1;
      }
      close(p[1]);
      std::fflush(nullptr);
      _exit(code);
    }
    close(p[1]);
    pids[std::size_t(r)] = pid;
    fds[std::size_t(r)] = p[0];
  }
  forked();
  std::vector<detail::rank_failure> failures;
  // Wait for every child with a deadline: once one rank has failed, every rank still inside a
  // collx call sees the job's abort (or its own timeout) and reports within opts.timeout; a rank
  // still running after min(opts.timeout, 10 s) + 1 s is stuck outside collx (user code, or a lock
  // its fork inherited held) and is killed, as mpirun and torchrun end a job one of whose ranks
  // failed. Without that a hung rank hung the launcher too.
  // A rank stopped by a signal (SIGSTOP, SIGTSTP: alive, never to end unless continued) while
  // every other rank has ended fails no peer and so starts no grace: it gets the grace from
  // the moment the last other rank ended (or it stopped, if later), then is killed and named.
  // (The chaos run hung so: the victim stopped once its peers had finished every call.)
  struct child_state {
    std::string msg;
    bool eof = false, reaped = false, ended = false;  // ended: waited for, not yet reaped here
    int status = 0;
    int stop_sig = 0;  // stopped by it now (0: running)
    std::chrono::steady_clock::time_point stopped_at{};
  };
  std::vector<child_state> kids(static_cast<std::size_t>(n));
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  int first_failed = -1;
  const auto grace = std::min<std::chrono::nanoseconds>(opts.timeout, std::chrono::seconds(10)) + std::chrono::seconds(1);
  const auto drain = [&](int r) {  // reads what is there; a closed or empty pipe ends it
    char b[4096];
    for (;;) {
      const ssize_t k = ::read(fds[std::size_t(r)], b, sizeof b);
      if (k > 0) kids[std::size_t(r)].msg.append(b, std::size_t(k));
      else if (k < 0 && errno == EINTR) continue;
      else {
        if (k == 0) kids[std::size_t(r)].eof = true;
        return;
      }
    }
  };
  for (int r = 0; r < n; ++r) fcntl(fds[std::size_t(r)], F_SETFL, fcntl(fds[std::size_t(r)], F_GETFL) | O_NONBLOCK);
  std::chrono::steady_clock::time_point others_ended{};  // when all but the stopped ones had ended
  for (int left = n; left > 0;) {
    std::vector<pollfd> pfds;
    std::vector<int> who;
    bool exiting = false;  // a pipe closed, its process not reaped yet: look again soon
    for (int r = 0; r < n; ++r) {
      const auto& k = kids[std::size_t(r)];
      if (k.reaped) continue;
      if (k.eof) exiting = true;
      else {
        pfds.push_back({fds[std::size_t(r)], POLLIN, 0});
        who.push_back(r);
      }
    }
    int wait_ms = exiting ? 1 : 50;
    if (kill_at) {
      const auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at - std::chrono::steady_clock::now()).count();
      wait_ms = int(std::clamp<long long>(left_ms, 0, wait_ms));
    }
    if (::poll(pfds.data(), pfds.size(), wait_ms) > 0)
      for (std::size_t i = 0; i < pfds.size(); ++i)
        if (pfds[i].revents != 0) drain(who[i]);
    const auto now = std::chrono::steady_clock::now();
    const bool overdue = kill_at && now >= *kill_at;
    // Stopped ranks, and whether they are all that is left (then each is overdue a grace after
    // both the others' end and its stop).
    int running = 0, stopped = 0, ended = n - left;
    for (int r = 0; r < n; ++r) {
      auto& k = kids[std::size_t(r)];
      if (k.reaped) continue;
      int st = 0;
      pid_t got = 0;
      while ((got = waitpid(pids[std::size_t(r)], &st, WNOHANG | WUNTRACED | WCONTINUED)) < 0 && errno == EINTR) {}
      if (got == pids[std::size_t(r)] && WIFSTOPPED(st)) {
        k.stop_sig = WSTOPSIG(st);
        k.stopped_at = now;
      } else if (got == pids[std::size_t(r)] && WIFCONTINUED(st)) {
        k.stop_sig = 0;
      } else if (got == pids[std::size_t(r)]) {  // it ended (reaped below)
        k.status = st;
        k.stop_sig = 0;
        k.ended = true;
      } else if (got < 0) {  // ECHILD: reaped by someone else (SIGCHLD ignored): its pipe says how it ended
        k.stop_sig = 0;
        k.ended = true;
      }
      if (k.stop_sig == 0 && !k.ended) ++running;
      stopped += k.stop_sig > 0;
      if (k.ended) ++ended;
    }
    // (Every rank stopped, none ended, is a job stopped on purpose: a debugger, a checkpoint.)
    if (running > 0 || ended == 0) others_ended = {};
    else if (others_ended == std::chrono::steady_clock::time_point{}) others_ended = now;
    for (int r = 0; r < n; ++r) {
      auto& k = kids[std::size_t(r)];
      if (k.reaped) continue;
      pid_t got = k.ended ? pids[std::size_t(r)] : 0;
      const bool stuck = k.stop_sig > 0 && others_ended != std::chrono::steady_clock::time_point{} &&
                         now >= std::max(others_ended, k.stopped_at) + grace;
      if (got == 0 && (stuck || overdue)) {
        kill(pids[std::size_t(r)], SIGKILL);
        while (waitpid(pids[std::size_t(r)], &k.status, 0) < 0 && errno == EINTR) {}
        drain(r);
        const std::string ms = std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(grace).count());
        const std::string was = k.stop_sig > 0 ? "was stopped by signal " + std::to_string(k.stop_sig) + " (" + strsignal(k.stop_sig) + ") and still stopped "
                                               : std::string("was still running ");
        if (k.msg.empty())
          k.msg = std::to_string(int(errc::peer_lost)) + "\nrank " + std::to_string(r) + " " + was + ms + " ms after " +
                  (stuck && !overdue ? std::string(stopped > 1 ? "every rank not stopped had ended" : "every other rank had ended") : "rank " + std::to_string(first_failed) + " failed") +
                  ", and was killed";
        got = pids[std::size_t(r)];
      }
      if (got == 0) continue;
      drain(r);
      close(fds[std::size_t(r)]);
      k.reaped = true;
      --left;
      const bool failed = !k.msg.empty() || WIFSIGNALED(k.status) || (WIFEXITED(k.status) && WEXITSTATUS(k.status) != 0);
      if (failed && !kill_at) {
        kill_at = std::chrono::steady_clock::now() + grace;
        first_failed = r;
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    const std::string& msg = kids[std::size_t(r)].msg;
    const int status = kids[std::size_t(r)].status;
    if (!msg.empty()) {
      const auto nl = msg.find('\n');
      failures.push_back({r, std::atoi(msg.substr(0, nl).c_str()), nl == std::string::npos ? msg : msg.substr(nl + 1)});
    } else if (WIFSIGNALED(status)) {
      failures.push_back({r, int(errc::peer_lost), "rank " + std::to_string(r) + " was killed by signal " +
                                                       std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")", true});
    } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      failures.push_back({r, int(errc::peer_lost), "rank " + std::to_string(r) + " exited with status " +
                                                       std::to_string(WEXITSTATUS(status)), true});
    }
  }
  if (!failures.empty()) throw detail::job_failure(failures, n);
}

/// Unlinks a job's shm segment and its splits' when the launcher returns: a rank that died
/// before everyone attached leaves them behind.
struct shm_job_cleanup {
  std::string name;
  explicit shm_job_cleanup(std::string n) : name(std::move(n)) {}
  shm_job_cleanup(const shm_job_cleanup&) = delete;
  shm_job_cleanup& operator=(const shm_job_cleanup&) = delete;
  ~shm_job_cleanup() {
    shm_unlink(name.c_str());
    const std::string prefix = name.substr(1) + ".";  // a split's is named after its parent's
    if (DIR* d = ::opendir("/dev/shm")) {
      std::vector<std::string> found;
      while (dirent* e = ::readdir(d))
        if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) found.push_back("/" + std::string(e->d_name));
      ::closedir(d);
      for (const std::string& f : found) shm_unlink(f.c_str());
    }
  }
};

}  // namespace detail

template <template <class> class Decorator, class F>
void launch_processes(int n, F&& f, options opts = {}, transport::shm::config cfg = {}) {
  if (n < 1) throw error(errc::invalid_argument, "launch_processes: the rank count must be at least 1, got " + std::to_string(n));
  const std::string job = detail::unique_job_name();
  detail::shm_job_cleanup cleanup{transport::shm::segment_name(job)};
  detail::launch_processes_with<Decorator>(
      n, job, [&](const std::string& j, int r) { return transport::shm(j, r, n, cfg); }, std::forward<F>(f), opts);
}

namespace detail {
/// launch_processes over tcp, job `job`, rank r's transport being wrap(its tcp transport, job, r).
template <template <class> class Decorator, class F, class Wrap>
void launch_tcp_processes(int n, const std::string& job, F&& f, const options& opts, transport::tcp_config cfg, Wrap&& wrap) {
  // The parent opens the store's listening socket before forking: rank 0 serves on it, the others
  // connect to it, and no port can be taken by someone else in between.
  auto listening = transport::net::listen_on(transport::net::resolve("127.0.0.1", 0));
  auto& listener = listening.first;  // not a structured binding: lambdas capture it (clang 14)
  const auto& at = listening.second;
  const int lfd = listener.get();
  // The job's secret, drawn here when none was given: the forked ranks have it in memory, and it
  // travels nowhere else (transport/tcp/secret.hpp).
  if (cfg.token.empty() && cfg.token_file.empty()) cfg.token = transport::tcp_detail::random_secret();
  launch_processes_with<Decorator>(
      n, job,
      [&, port = at.port()](const std::string& j, int r) {
        transport::tcp_config c = cfg;
        if (c.store_path.empty()) {
          c.master_addr = "127.0.0.1";
          c.master_port = port;
          if (r == 0) c.serve_store_fd = ::dup(lfd);
        }
        ::close(lfd);
        return wrap(transport::tcp(j, r, n, std::move(c)), j, r);
      },
      std::forward<F>(f), opts,
      // Rank 0 serves on its own copy: were the parent's kept open, a rank connecting after rank 0
      // died would sit in the dead listener's queue until its deadline instead of being refused.
      [&] { listener.reset(); });
}
}  // namespace detail

template <template <class> class Decorator, class F>
void launch_processes(int n, F&& f, options opts, transport::tcp_config cfg) {
  if (n < 1) throw error(errc::invalid_argument, "launch_processes: the rank count must be at least 1, got " + std::to_string(n));
  detail::launch_tcp_processes<Decorator>(n, detail::unique_job_name(), std::forward<F>(f), opts, std::move(cfg),
                                          [](transport::tcp t, const std::string&, int) { return t; });
}

template <class F>
void launch_processes(int n, F&& f, options opts = {}, transport::shm::config cfg = {}) {
  launch_processes<detail::no_decorator>(n, std::forward<F>(f), opts, cfg);
}

template <class F>
void launch_processes(int n, F&& f, options opts, transport::tcp_config cfg) {
  launch_processes<detail::no_decorator>(n, std::forward<F>(f), opts, std::move(cfg));
}

}  // namespace collx
