// A rank of a job started by a launcher: mpirun, srun or torchrun sets the environment, and
// transport::shm::from_env(), transport::tcp::from_env() or two_level<shm, tcp>::from_env()
// reads who this process is, which job it belongs to and (tcp) where the job's rendezvous is:
// MASTER_ADDR:MASTER_PORT, else (built with collx::pmix, as here where PMIx is found) the store
// of a PMIx launcher.
//
//   mpirun -np 4 ./from_env                       # shared memory (one host)
//   mpirun -np 4 ./from_env tcp                   # tcp, meeting through mpirun's PMIx
//   mpirun -np 4 --host a:2,b:2 ./from_env two_level   # shm within each host, tcp between
//   mpirun -np 4 -x MASTER_ADDR=host0 -x MASTER_PORT=29500 ./from_env tcp
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=localhost MASTER_PORT=29500 ./from_env tcp &
//   RANK=1 WORLD_SIZE=2 MASTER_ADDR=localhost MASTER_PORT=29500 ./from_env tcp
#include <collx/collx.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const bool tcp = argc > 1 && std::strcmp(argv[1], "tcp") == 0;
  const bool two_level = argc > 1 && std::strcmp(argv[1], "two_level") == 0;
  try {
    const collx::launch_info who = collx::launch_info_from_env();
    // One instantiation of the collectives serves both transports (transport::any).
    std::string where;  // tcp: where a peer was found
    auto make = [&]() -> collx::transport::any {
      if (two_level) {
        auto t = collx::transport::two_level<collx::transport::shm, collx::transport::tcp>::from_env();
        where = " (" + std::to_string(t.nodes().nodes()) + " nodes)";
        return t;
      }
      if (!tcp) return collx::transport::shm::from_env();
      collx::transport::tcp t = collx::transport::tcp::from_env();
      if (t.size() > 1) where = " (peer at " + t.peer_address(t.rank() == 0 ? 1 : 0) + ")";
      return t;
    };
    collx::communicator<collx::transport::any> comm{make()};
    // Every rank contributes its rank number; the sum is n(n-1)/2 everywhere.
    std::vector<long> v(1'000'003, comm.rank());
    collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
    const long want = long(comm.size()) * (comm.size() - 1) / 2;
    std::size_t bad = 0;
    for (long x : v) bad += x != want;
    std::vector<long> ranks(std::size_t(comm.size()));
    const long me = comm.rank();
    collx::all_gather(comm, std::span<const long>{&me, 1}, std::span{ranks});
    for (int i = 0; i < comm.size(); ++i) bad += ranks[std::size_t(i)] != i;
    std::printf("rank %d of %d (launcher %s, job %s, %s): all_reduce and all_gather %s%s\n", comm.rank(), comm.size(),
                who.launcher.c_str(), who.job.c_str(), comm.transport().kind(), bad ? "WRONG" : "ok", where.c_str());
    comm.transport().leave();
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "from_env: %s\n", e.what());
    return 2;
  }
}
