// collx-chaos: for a bounded time, trial after trial, a random workload (collectives of random
// kinds, sizes and groups, every result checked) on N processes over shm or tcp, in which one
// rank is killed (SIGKILL) or stopped (SIGSTOP) at a random moment. Reports trials, hangs (must
// be 0), wrong results (must be 0), survivors whose error does not name the killed rank (must
// be 0), segments left in /dev/shm (must be 0), and the worst time from the fault to a
// survivor's error. A stopped rank is named where its peers see it silent in the call (the
// desync report over shm); a rank that waits on one that waits on the stopped rank, or that
// stopped between calls, names the rank it waited for: counted, not required.
//
//   collx-chaos --transport shm|tcp --seconds S [--seed X] [--ranks-max N]
//
// Each trial runs in a process of its own (its ranks are its children, in its process group),
// so a trial that hangs is seen from outside and killed whole: the run never hangs itself.
// The victim faults itself: a thread it starts fires at a random moment, mid-call or between
// calls (a parent thread could not: launch_processes forks from a single-threaded process).
// A stopped rank never answers; its peers time out (COLLX_TIMEOUT_S, 1 s here) and
// launch_processes kills it once they have reported.
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
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <collx/collx.hpp>

namespace {

using comm_t = collx::communicator<collx::transport::any>;
using namespace std::chrono_literals;

constexpr int kMaxRanks = 8;
constexpr int kOps = 400;  // a trial's calls, more than the fault lets most ranks make

struct rank_report {
  std::atomic<int> state;  // 0 running, 1 finished every call, 2 failed
  std::atomic<int> wrong;
  std::atomic<int> calls;
  std::int64_t error_ns;
  int code;
  char error[8192];  // whole: the faulty rank is named at the end of a chain of failures
};
struct trial_report {
  std::atomic<std::int64_t> fault_ns;  // when the victim faulted (0: it finished first)
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

/// The workload: the same random sequence on every rank (seeded by the plan), each call's result
/// checked against a serial reference computed from the inputs.
void workload(comm_t& world, const plan& p, trial_report& rep) {
  const int me = world.rank(), n = world.size();
  rank_report& mine = rep.rank[me];
  if (me == p.victim) {
    std::thread([&rep, p] {
      std::this_thread::sleep_for(std::chrono::milliseconds(p.delay_ms));
      rep.fault_ns.store(now_ns());
      ::kill(::getpid(), p.stop ? SIGSTOP : SIGKILL);
    }).detach();
  }
  comm_t half = world.split(me % 2, me, "half");  // ranks 0, 2, 4, ... and 1, 3, 5, ...
  std::mt19937_64 rng(p.seed);
  const std::size_t sizes[] = {0, 1, 2, 7, 64, 1000, 4099, 65537};
  for (int k = 0; k < kOps; ++k) {
    const int kind = int(rng() % 6);
    const std::size_t count = sizes[rng() % std::size(sizes)];
    const bool on_half = rng() % 3 == 0 && n >= 2;
    comm_t& c = on_half ? half : world;
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
    if (bad != 0) mine.wrong.fetch_add(bad);
    mine.calls.fetch_add(1);
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
      throw;
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

int segments_named(const std::string& prefix) {
  int k = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) ++k;
    ::closedir(d);
  }
  return k;
}

}  // namespace

int main(int argc, char** argv) {
  std::string transport = "shm";
  double seconds = 20;
  std::uint64_t seed = std::random_device{}();
  int ranks_max = kMaxRanks;
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
    else {
      std::fprintf(stderr, "usage: collx-chaos --transport shm|tcp --seconds S [--seed X] [--ranks-max N]\n");
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
  int trials = 0, hangs = 0, wrong = 0, unnamed = 0, leaked = 0, kills = 0, stops = 0, stop_errors = 0, stop_named = 0;
  double worst_kill_ms = 0, worst_stop_ms = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    plan p;
    p.n = 3 + int(rng() % std::uint64_t(ranks_max - 2));
    p.victim = int(rng() % std::uint64_t(p.n));
    p.stop = rng() % 3 == 0;
    p.delay_ms = 2 + int(rng() % 150);
    p.seed = rng();
    std::memset(static_cast<void*>(rep), 0, sizeof *rep);
    const pid_t t = ::fork();
    if (t < 0) return 1;
    if (t == 0) {
      ::setpgid(0, 0);  // the trial and its ranks: one group to kill if it hangs
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
    while (::waitpid(t, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > bound) {
        hung = true;
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
      if (p.stop) {
        ++stop_errors;
        stop_named += names_rank(m.error, p.victim);
        continue;
      }
      if (!names_rank(m.error, p.victim)) {
        ++unnamed;
        note += " rank " + std::to_string(r) + "'s error does not name rank " + std::to_string(p.victim) + ": " + m.error;
      }
    }
    const int left = segments_named("collx-lp" + std::to_string(t) + "-");
    if (left != 0) {
      leaked += left;
      note += " " + std::to_string(left) + " segment(s) left in /dev/shm";
    }
    if (!note.empty() || trials <= 3)
      std::printf("trial %d: %d ranks, rank %d %s after %d ms, fault %s:%s\n", trials, p.n, p.victim,
                  p.stop ? "stopped" : "killed", p.delay_ms, fault != 0 ? "fired" : "after the workload", note.empty() ? " ok" : note.c_str());
    std::fflush(stdout);
  }
  std::printf("# %d trials (%d kills, %d stops): %d hangs, %d wrong elements, %d survivors' errors not naming the killed rank, "
              "%d segments left; worst time from the fault to a survivor's error: %.0f ms after a kill, %.0f ms after a stop "
              "(COLLX_TIMEOUT_S=1); stops: %d of %d survivors' errors name the stopped rank\n",
              trials, kills, stops, hangs, wrong, unnamed, leaked, worst_kill_ms, worst_stop_ms, stop_named, stop_errors);
  return hangs == 0 && wrong == 0 && unnamed == 0 && leaked == 0 && trials > 0 ? 0 : 1;
}
