// tcp-stream: what one TCP stream on 127.0.0.1 moves on this machine, with plain sockets (no
// collx transport), for the Gloo comparison's "≥ 50 % of one loopback stream" yardstick.
//
//   tcp-stream [-s SIZE] [-n ITERS]      (default 64M, 10)
//
// A forked receiver reads SIZE-byte messages into one buffer; the sender writes them from
// another (both buffers SIZE bytes, so they come from memory as a collective's do), one process
// per core as collx-perf's ranks are. Prints GB/s (1e9) of the median of ITERS messages.
#include <sched.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include <collx/transport/tcp/socket.hpp>

#include "cli.hpp"

namespace net = collx::transport::net;

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  sched_setaffinity(0, sizeof s, &s);
}

int main(int argc, char** argv) {
  std::size_t size = std::size_t(64) << 20;
  int iters = 10;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if ((a == "-s" || a == "-n") && i + 1 >= argc) throw bench_cli::usage_error("-s and -n need a value");
      if (a == "-s") size = bench_cli::parse_size(a, argv[++i]);
      else if (a == "-n") iters = int(bench_cli::parse_int(a, argv[++i], 1, 1 << 20));
      else throw bench_cli::usage_error("usage: tcp-stream [-s SIZE] [-n ITERS]");
    }
  } catch (const bench_cli::usage_error& e) {
    std::fprintf(stderr, "tcp-stream: %s\n", e.what());
    return 2;
  }
  const bool two_cores = sysconf(_SC_NPROCESSORS_ONLN) >= 2;
  auto [l, at] = net::listen_on(net::resolve("127.0.0.1", 0));
  std::fflush(nullptr);
  const pid_t kid = fork();
  const auto forever = [] { return net::clock::now() + std::chrono::seconds(120); };
  if (kid == 0) {  // the receiver
    if (two_cores) pin(1);
    std::string why;
    net::fd s = net::connect_until(at, forever(), why);
    if (!s) _exit(3);
    std::vector<char> buf(size, 0);
    for (int i = 0; i <= iters; ++i) {
      if (net::read_exact(s.get(), buf.data(), size, forever()) != net::io::ok) _exit(3);
      const char ack = 1;
      if (net::write_all(s.get(), &ack, 1, forever()) != net::io::ok) _exit(3);
    }
    _exit(0);
  }
  if (two_cores) pin(0);
  int f = -1;
  while (f < 0) {
    pollfd p{l.get(), POLLIN, 0};
    ::poll(&p, 1, 1000);
    f = ::accept(l.get(), nullptr, nullptr);
  }
  net::fd s(f);
  net::set_nonblocking(f);
  net::set_nodelay(f);
  std::vector<char> buf(size, 1);
  std::vector<double> gbs;
  for (int i = 0; i <= iters; ++i) {  // the first is a warm-up
    const auto t0 = net::clock::now();
    char ack = 0;
    if (net::write_all(f, buf.data(), size, forever()) != net::io::ok || net::read_exact(f, &ack, 1, forever()) != net::io::ok) {
      std::fprintf(stderr, "tcp-stream: the receiver failed\n");
      return 3;
    }
    const double sec = std::chrono::duration<double>(net::clock::now() - t0).count();
    if (i > 0) gbs.push_back(double(size) / sec / 1e9);
  }
  int st = 0;
  waitpid(kid, &st, 0);
  std::sort(gbs.begin(), gbs.end());
  std::printf("# tcp-stream: one TCP stream on 127.0.0.1, %zu-byte messages, median of %d\n%.2f GB/s\n", size, iters,
              gbs[gbs.size() / 2]);
  return 0;
}
