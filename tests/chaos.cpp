// collx-chaos: for a bounded time, trial after trial, a random workload (collectives of random
// kinds, sizes and groups, every result checked) on N processes over shm or tcp, in which one
// rank is killed (SIGKILL) or stopped (SIGSTOP) at a random moment. Reports trials, hangs (must
// be 0), wrong results (must be 0), survivors whose error does not name the killed rank (must
// be 0), segments left in /dev/shm (must be 0), and the worst time from the fault to a
// survivor's error. Then each survivor shrinks the job's communicator (communicator::shrink)
// and makes more random calls among the survivors: shrinks that fail, survivors that disagree
// on who is left, and wrong results after it must be 0 too. A stopped rank is named where its peers see it silent in the call (the
// desync report over shm); a rank that waits on one that waits on the stopped rank, or that
// stopped between calls, names the rank it waited for: counted, not required.
//
//   collx-chaos --transport shm|tcp --seconds S [--seed X] [--ranks-max N] [--trace PATH]
//
// A trial that hangs is shown before it is killed: each of its processes' state and kernel
// wait channel, then the flight recorders' dumps (SIGUSR2, COLLX_DUMP_ON_SIGUSR2=1, into the
// trial's own folder) read by collx-trace (--trace: its path). A survivor whose error came late after a stop (more than
// 1.5 s, with COLLX_TIMEOUT_S=1) is shown with its error: both are for finding out why.
//
// Each trial runs in a process of its own (its ranks are its children, in its process group),
// so a trial that hangs is seen from outside and killed whole: the run never hangs itself.
// The victim faults itself: a thread it starts fires at a random moment, mid-call or between
// calls (a parent thread could not: launch_processes forks from a single-threaded process).
// A stopped rank never answers; its peers time out (COLLX_TIMEOUT_S, 1 s here), shrink
// without it once their shrink's deadline (the same) has passed, and then kill it (as the job's
// launcher would), or launch_processes does once one of them has failed.
// Exit status 0 when every count that must be 0 is; 1 otherwise; 2 for bad flags.
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <collx/collx.hpp>

#include "leaks.hpp"

namespace {

using comm_t = collx::communicator<collx::transport::any>;
using namespace std::chrono_literals;

constexpr int kMaxRanks = 8;
constexpr int kOps = 400;  // a trial's calls, more than the fault lets most ranks make
constexpr int kAfterOps = 40;  // the survivors' calls after they shrink

struct rank_report {
  std::atomic<int> state;  // 0 running, 1 finished every call, 2 failed
  std::atomic<int> wrong;
  std::atomic<int> calls;
  std::int64_t error_ns;
  int code;
  char error[8192];  // whole: the faulty rank is named at the end of a chain of failures
  // After its failure a survivor shrinks the job's communicator and makes kAfterOps more calls
  // among the survivors.
  std::atomic<int> shrunk;  // 0 not tried, 1 shrank and made every call, 2 failed (shrink_error)
  int shrunk_size;
  std::int64_t shrunk_ns;
  std::atomic<int> after_wrong;
  std::atomic<int> after_calls;
  char shrink_error[2048];
};
struct trial_report {
  std::atomic<std::int64_t> fault_ns;  // when the victim faulted (0: it finished first)
  std::atomic<int> victim_pid;
  rank_report rank[kMaxRanks];
};

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct plan {
  int n = 3, victim = 0;
  bool stop = false;  // SIGSTOP, else SIGKILL
  int delay_ms = 0;
  std::uint64_t seed = 0;
};

/// Element i of rank r's input to call k: small integers, so every sum is exact.
float input(int r, int k, std::size_t i) { return float((r * 7 + int(i % 1000) * 3 + k) % 13); }

/// One call of kind `kind` (0 all_reduce, 1 broadcast, 2 all_gather, 3 reduce_scatter, 4
/// all_to_all, else barrier) of `count` elements on c, its k-th; returns the elements that differ
/// from the serial reference. `rng` (the same on every rank) picks a broadcast's root.
int checked_call(comm_t& c, int kind, std::size_t count, int k, std::mt19937_64& rng) {
  const int cn = c.size(), cr = c.rank();
  auto job = [&](int q) { return c.job_rank(q); };
  int bad = 0;
  switch (kind) {
    case 0: {  // all_reduce
      std::vector<float> v(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = input(job(cr), k, i);
      collx::all_reduce(c, std::span(v), collx::ops::sum{}, collx::algo::automatic{});
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < cn; ++q) want += input(job(q), k, i);
        bad += v[i] != want;
      }
      break;
    }
    case 1: {  // broadcast
      const int root = int(rng() % std::uint64_t(cn));
      std::vector<float> v(count, -1.0f);
      if (cr == root)
        for (std::size_t i = 0; i < count; ++i) v[i] = input(job(root), k, i);
      collx::broadcast(c, std::span(v), root, collx::algo::automatic{});
      for (std::size_t i = 0; i < count; ++i) bad += v[i] != input(job(root), k, i);
      break;
    }
    case 2: {  // all_gather
      std::vector<float> in(count), out(count * std::size_t(cn));
      for (std::size_t i = 0; i < count; ++i) in[i] = input(job(cr), k, i);
      collx::all_gather(c, std::span<const float>(in), std::span(out), collx::algo::automatic{});
      for (int q = 0; q < cn; ++q)
        for (std::size_t i = 0; i < count; ++i) bad += out[std::size_t(q) * count + i] != input(job(q), k, i);
      break;
    }
    case 3: {  // reduce_scatter
      std::vector<float> in(count * std::size_t(cn)), out(count);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = input(job(cr), k, i);
      collx::reduce_scatter(c, std::span<const float>(in), std::span(out), collx::ops::sum{}, collx::algo::automatic{});
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < cn; ++q) want += input(job(q), k, std::size_t(cr) * count + i);
        bad += out[i] != want;
      }
      break;
    }
    case 4: {  // all_to_all: block d of rank s's input goes to rank d
      std::vector<float> in(count * std::size_t(cn)), out(count * std::size_t(cn));
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = input(job(cr), k, i);
      collx::all_to_all(c, std::span<const float>(in), std::span(out), collx::algo::pairwise{});
      for (int s = 0; s < cn; ++s)
        for (std::size_t i = 0; i < count; ++i)
          bad += out[std::size_t(s) * count + i] != input(job(s), k, std::size_t(cr) * count + i);
      break;
    }
    default: collx::barrier(c); break;
  }
  return bad;
}

constexpr std::size_t kSizes[] = {0, 1, 2, 7, 64, 1000, 4099, 65537};

/// `ops` random calls on `world` and on a half of it split from it (ranks 0, 2, 4, ... and 1,
/// 3, 5, ... of world): the same sequence on every rank (seeded by `seed`), each call checked.
void random_calls(comm_t& world, std::uint64_t seed, int ops, std::atomic<int>& wrong, std::atomic<int>& calls) {
  const int me = world.rank(), n = world.size();
  comm_t half = world.split(me % 2, me, "half");
  std::mt19937_64 rng(seed);
  for (int k = 0; k < ops; ++k) {
    const int kind = int(rng() % 6);
    const std::size_t count = kSizes[rng() % std::size(kSizes)];
    const bool on_half = rng() % 3 == 0 && n >= 2;
    const int bad = checked_call(on_half ? half : world, kind, count, k, rng);
    if (bad != 0) wrong.fetch_add(bad);
    calls.fetch_add(1);
  }
}

/// The workload: the victim arms its fault, then every rank makes the trial's calls.
void workload(comm_t& world, const plan& p, trial_report& rep) {
  if (world.rank() == p.victim) {
    rep.victim_pid.store(::getpid());
    std::thread([&rep, p] {
      std::this_thread::sleep_for(std::chrono::milliseconds(p.delay_ms));
      rep.fault_ns.store(now_ns());
      ::kill(::getpid(), p.stop ? SIGSTOP : SIGKILL);
    }).detach();
  }
  rank_report& mine = rep.rank[world.rank()];
  random_calls(world, p.seed, kOps, mine.wrong, mine.calls);
}

/// A survivor, after its failure: shrinks the job's communicator, stops a stopped victim for
/// good (the survivors have gone on without it: what the job's launcher would do), and makes
/// more calls among the survivors.
void carry_on(comm_t& world, const plan& p, trial_report& rep) {
  rank_report& m = rep.rank[world.rank()];
  try {
    comm_t c2 = world.shrink();
    m.shrunk_ns = now_ns();
    m.shrunk_size = c2.size();
    if (p.stop && rep.victim_pid.load() > 0) ::kill(rep.victim_pid.load(), SIGKILL);
    random_calls(c2, p.seed ^ 0x5eed, kAfterOps, m.after_wrong, m.after_calls);
    m.shrunk.store(1);
  } catch (const std::exception& e) {
    std::snprintf(m.shrink_error, sizeof m.shrink_error, "%s", e.what());
    m.shrunk.store(2);
  }
}

/// One trial, in the calling process (a trial process): its ranks are forked from here.
void run_trial(const plan& p, const std::string& transport, trial_report& rep) {
  auto body = [&](comm_t& comm) {
    try {
      workload(comm, p, rep);
      rep.rank[comm.rank()].state.store(1);
    } catch (const std::exception& e) {
      rank_report& m = rep.rank[comm.rank()];
      m.error_ns = now_ns();
      const auto* ce = dynamic_cast<const collx::error*>(&e);
      m.code = ce != nullptr ? ce->code().value() : -1;
      std::snprintf(m.error, sizeof m.error, "%s", e.what());
      m.state.store(2);
      carry_on(comm, p, rep);
      if (m.shrunk.load() != 1) throw;
    }
  };
  try {
    if (transport == "tcp")
      collx::launch_processes<collx::transport::as_any>(p.n, body, collx::options{}, collx::transport::tcp_config{});
    else
      collx::launch_processes<collx::transport::as_any>(p.n, body);
  } catch (const std::exception&) {
    // the victim's fault fails the job: what each rank saw is in rep
  }
}

/// The processes of process group `pg`, each with its state and kernel wait channel
/// (/proc/<pid>/stat, wchan): a hung trial's ranks spinning (R) or asleep (S) and where.
std::string group_states(pid_t pg) {
  std::string out;
  if (DIR* d = ::opendir("/proc")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      std::ifstream st(std::string("/proc/") + e->d_name + "/stat");
      std::string line;
      std::getline(st, line);
      const std::size_t close = line.rfind(')');
      if (close == std::string::npos) continue;
      char state = '?';
      long ppid = 0, pgrp = 0;
      if (std::sscanf(line.c_str() + close + 1, " %c %ld %ld", &state, &ppid, &pgrp) != 3 || pgrp != pg) continue;
      std::ifstream wc(std::string("/proc/") + e->d_name + "/wchan");
      std::string wchan;
      std::getline(wc, wchan);
      const int threads = collx_test::thread_count(std::string("/proc/") + e->d_name);
      out += std::string("    pid ") + e->d_name + " (parent " + std::to_string(ppid) + "): state " + state + ", wchan " +
             (wchan.empty() ? "-" : wchan) + ", " + std::to_string(threads) + " threads\n";
    }
    ::closedir(d);
  }
  return out;
}

/// What collx-trace says about the dumps in `dir` (none: empty).
std::string trace_of(const std::string& tool, const std::string& dir) {
  if (tool.empty()) return "    (no --trace: the dumps are in " + dir + ")\n";
  std::string out;
  if (FILE* f = ::popen(("'" + tool + "' '" + dir + "' 2>&1").c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, f) != nullptr) out += std::string("    ") + buf;
    ::pclose(f);
  }
  return out;
}

/// Whether `msg` names rank v as a rank ("rank 3" not followed by a digit), or as a job rank.
bool names_rank(const std::string& msg, int v) {
  for (const std::string& w : {"rank " + std::to_string(v), "job rank " + std::to_string(v)}) {
    for (std::size_t at = msg.find(w); at != std::string::npos; at = msg.find(w, at + 1)) {
      const std::size_t end = at + w.size();
      if (end >= msg.size() || msg[end] < '0' || msg[end] > '9') return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::string transport = "shm";
  double seconds = 20;
  std::uint64_t seed = std::random_device{}();
  int ranks_max = kMaxRanks;
  std::string trace_tool;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "collx-chaos: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--transport") transport = value();
    else if (a == "--seconds") seconds = std::stod(value());
    else if (a == "--seed") seed = std::stoull(value());
    else if (a == "--ranks-max") ranks_max = std::clamp(std::stoi(value()), 3, kMaxRanks);
    else if (a == "--trace") trace_tool = value();
    else {
      std::fprintf(stderr, "usage: collx-chaos --transport shm|tcp --seconds S [--seed X] [--ranks-max N] [--trace PATH]\n");
      return 2;
    }
  }
  if (transport != "shm" && transport != "tcp") {
    std::fprintf(stderr, "collx-chaos: --transport is shm or tcp\n");
    return 2;
  }
  ::setenv("COLLX_TIMEOUT_S", "1", 1);  // a stopped rank is found by its peers' deadlines
  auto* rep = static_cast<trial_report*>(mmap(nullptr, sizeof(trial_report), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (rep == MAP_FAILED) return 1;
  std::mt19937_64 rng(seed);
  std::printf("# collx-chaos --transport %s --seconds %g --seed %llu\n", transport.c_str(), seconds, (unsigned long long)seed);
  std::fflush(stdout);  // before the first fork, or the trial's process prints it again
  int trials = 0, hangs = 0, wrong = 0, unnamed = 0, leaked = 0, kills = 0, stops = 0, stop_errors = 0, stop_named = 0;
  int shrinks = 0, shrink_failed = 0, split_views = 0, after_wrong = 0;
  double worst_kill_ms = 0, worst_stop_ms = 0, worst_kill_shrunk_ms = 0, worst_stop_shrunk_ms = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    plan p;
    p.n = 3 + int(rng() % std::uint64_t(ranks_max - 2));
    p.victim = int(rng() % std::uint64_t(p.n));
    p.stop = rng() % 3 == 0;
    p.delay_ms = 2 + int(rng() % 150);
    p.seed = rng();
    std::memset(static_cast<void*>(rep), 0, sizeof *rep);
    // Each trial's ranks dump their flight recorders here on SIGUSR2 (the trial's working
    // folder: COLLX_DUMP_DIR unset, so no dump slows a failed call down); kept only when the
    // trial hangs.
    const std::string dumps = (std::filesystem::temp_directory_path() / ("collx-chaos-" + std::to_string(::getpid()) + "-" +
                                                                         std::to_string(trials + 1))).string();
    const pid_t t = ::fork();
    if (t < 0) return 1;
    if (t == 0) {
      ::setpgid(0, 0);  // the trial and its ranks: one group to kill if it hangs
      std::filesystem::create_directories(dumps);
      if (::chdir(dumps.c_str()) != 0) ::_exit(3);
      ::setenv("COLLX_DUMP_ON_SIGUSR2", "1", 1);
      ::signal(SIGUSR2, SIG_IGN);  // the trial's own process (its ranks install their handler)
      run_trial(p, transport, *rep);
      std::fflush(nullptr);
      ::_exit(0);
    }
    ::setpgid(t, t);
    // A trial's bound: the fault, the peers' deadline (1 s), launch_processes' grace to report
    // (min(timeout, 10 s) + 1 s), setup, with room; past it the trial is a hang.
    const auto bound = std::chrono::steady_clock::now() + 30s;
    int status = 0;
    bool hung = false;
    std::string hang_report;
    while (::waitpid(t, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > bound) {
        hung = true;
        hang_report = "  its processes, 30 s into the trial:\n" + group_states(t);
        ::kill(-t, SIGCONT);  // a stopped victim dumps too
        ::kill(-t, SIGUSR2);
        std::this_thread::sleep_for(500ms);
        hang_report += "  collx-trace over their dumps:\n" + trace_of(trace_tool, dumps);
        ::kill(-t, SIGKILL);
        ::waitpid(t, &status, 0);
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    ++trials;
    (p.stop ? stops : kills) += 1;
    const std::int64_t fault = rep->fault_ns.load();
    std::string note;
    if (hung) {
      ++hangs;
      note += " HANG";
    }
    for (int r = 0; r < p.n; ++r) {
      const rank_report& m = rep->rank[r];
      wrong += m.wrong.load();
      if (m.wrong.load() != 0) note += " rank " + std::to_string(r) + ": " + std::to_string(m.wrong.load()) + " wrong";
      if (r == p.victim || m.state.load() != 2) continue;
      if (fault != 0) {
        double& worst = p.stop ? worst_stop_ms : worst_kill_ms;
        worst = std::max(worst, double(m.error_ns - fault) / 1e6);
      }
      // The survivors' shrink: every one that tried made it, all agree on its size (the ranks
      // that shrank), and their calls after it are right.
      ++shrinks;
      after_wrong += m.after_wrong.load();
      if (m.after_wrong.load() != 0) note += " rank " + std::to_string(r) + ": " + std::to_string(m.after_wrong.load()) + " wrong after the shrink";
      if (m.shrunk.load() != 1) {
        ++shrink_failed;
        note += " rank " + std::to_string(r) + "'s shrink failed: " + m.shrink_error + " (its failure, " +
                std::to_string(fault != 0 ? (m.error_ns - fault) / 1000000 : 0) + " ms after the fault: " + m.error + ")";
      } else {
        int shrank = 0;
        for (int q = 0; q < p.n; ++q) shrank += rep->rank[q].shrunk.load() == 1;
        if (m.shrunk_size != shrank) {
          ++split_views;
          note += " rank " + std::to_string(r) + " shrank to " + std::to_string(m.shrunk_size) + " ranks, " + std::to_string(shrank) + " did";
        }
        if (fault != 0) {
          double& worst = p.stop ? worst_stop_shrunk_ms : worst_kill_shrunk_ms;
          worst = std::max(worst, double(m.shrunk_ns - fault) / 1e6);
        }
      }
      if (p.stop) {
        if (fault != 0 && m.error_ns - fault > 1500000000)
          note += " rank " + std::to_string(r) + "'s error came " + std::to_string((m.error_ns - fault) / 1000000) +
                  " ms after the stop: " + std::string(m.error).substr(0, 600);
        ++stop_errors;
        stop_named += names_rank(m.error, p.victim);
        continue;
      }
      if (!names_rank(m.error, p.victim)) {
        ++unnamed;
        note += " rank " + std::to_string(r) + "'s error does not name rank " + std::to_string(p.victim) + ": " + m.error;
      }
    }
    const int left = collx_test::shm_names("collx-lp" + std::to_string(t) + "-");
    if (left != 0) {
      leaked += left;
      note += " " + std::to_string(left) + " segment(s) left in /dev/shm";
    }
    if (!note.empty() || trials <= 3)
      std::printf("trial %d: %d ranks, rank %d %s after %d ms, fault %s:%s\n", trials, p.n, p.victim,
                  p.stop ? "stopped" : "killed", p.delay_ms, fault != 0 ? "fired" : "after the workload", note.empty() ? " ok" : note.c_str());
    if (hung) std::printf("%s", hang_report.c_str());
    std::error_code ignored;
    if (!hung) std::filesystem::remove_all(dumps, ignored);
    std::fflush(stdout);
  }
  std::printf("# %d trials (%d kills, %d stops): %d hangs, %d wrong elements, %d survivors' errors not naming the killed rank, "
              "%d segments left; worst time from the fault to a survivor's error: %.0f ms after a kill, %.0f ms after a stop "
              "(COLLX_TIMEOUT_S=1); stops: %d of %d survivors' errors name the stopped rank\n",
              trials, kills, stops, hangs, wrong, unnamed, leaked, worst_kill_ms, worst_stop_ms, stop_named, stop_errors);
  std::printf("# shrink: %d survivors shrank and went on: %d failed, %d disagreed on who is left, %d wrong elements after it; "
              "worst time from the fault to the new communicator: %.0f ms after a kill, %.0f ms after a stop\n",
              shrinks, shrink_failed, split_views, after_wrong, worst_kill_shrunk_ms, worst_stop_shrunk_ms);
  return hangs == 0 && wrong == 0 && unnamed == 0 && leaked == 0 && shrink_failed == 0 && split_views == 0 && after_wrong == 0 &&
                 trials > 0
             ? 0
             : 1;
}
