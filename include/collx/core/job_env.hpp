#pragma once
// Who am I in this job? One reader of the launchers' conventions, shared by every transport that
// starts from the environment (shared memory today, sockets next):
//   collx:    COLLX_RANK, COLLX_WORLD_SIZE, COLLX_JOB                      (explicit, wins)
//   torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID
//   mpirun:   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//             PMIX_NAMESPACE / OMPI_MCA_ess_base_jobid (the job)
//   srun:     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_ID, SLURM_STEP_ID
//   PMI:      PMI_RANK, PMI_SIZE, PMI_KVSNAME / PMI_JOBID
// The job name keys everything a job shares (a shared-memory segment, a rendezvous), so two
// jobs on one host never mix.
#include <cstdlib>
#include <string>

#include "settings.hpp"
#include "error.hpp"

namespace collx {

struct launch_info {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  std::string job;          // unique per job on this host
  std::string launcher;     // which convention was found: "collx", "torchrun", "mpirun", "srun", "pmi"
  std::string master_addr;  // torchrun's rendezvous address, when given
  int master_port = 0;
};


/// Whether this process was started by a launcher that serves PMIx (mpirun, srun --mpi=pmix:
/// its variables are set; transport/tcp/pmix_store.hpp meets there).
inline bool pmix_launched() { return std::getenv("PMIX_NAMESPACE") != nullptr && std::getenv("PMIX_RANK") != nullptr; }

/// Reads the launcher's variables. Throws errc::invalid_argument, naming the variables it looked
/// for, when no launcher convention is present or a value is malformed.
inline launch_info launch_info_from_env() {
  using detail::env;
  launch_info li;
  struct convention { const char *launcher, *rank, *size, *local; };
  static constexpr convention conventions[] = {
      {"collx", "COLLX_RANK", "COLLX_WORLD_SIZE", "COLLX_LOCAL_RANK"},
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
  };
  const convention* found = nullptr;
  for (const auto& c : conventions)
    if (env(c.rank) && env(c.size)) {
      found = &c;
      break;
    }
  if (found == nullptr)
    throw error(errc::invalid_argument,
                "collx: no launcher found in the environment: set RANK and WORLD_SIZE (torchrun), "
                "OMPI_COMM_WORLD_RANK/SIZE (mpirun), SLURM_PROCID/SLURM_NTASKS (srun), PMI_RANK/PMI_SIZE, "
                "or COLLX_RANK/COLLX_WORLD_SIZE");
  li.launcher = found->launcher;
  li.size = detail::env_int(found->size, 1, 1 << 20);
  li.rank = detail::env_int(found->rank, 0, li.size - 1);
  li.local_rank = env(found->local) ? detail::env_int(found->local, 0, li.size - 1) : li.rank;
  if (env("MASTER_ADDR")) li.master_addr = env("MASTER_ADDR");
  if (env("MASTER_PORT")) li.master_port = detail::env_int("MASTER_PORT", 1, 65535);

  // The job's name: explicit, else what the launcher gives every rank of one job alike.
  auto s = [](const char* v) { return std::string(v); };
  if (env("COLLX_JOB")) li.job = env("COLLX_JOB");
  else if (li.launcher == "mpirun" && env("PMIX_NAMESPACE")) li.job = "ompi-" + s(env("PMIX_NAMESPACE"));
  else if (li.launcher == "mpirun" && env("OMPI_MCA_ess_base_jobid")) li.job = "ompi-" + s(env("OMPI_MCA_ess_base_jobid"));
  else if (li.launcher == "srun" && env("SLURM_JOB_ID"))
    li.job = "slurm-" + s(env("SLURM_JOB_ID")) + "." + (env("SLURM_STEP_ID") ? s(env("SLURM_STEP_ID")) : s("0"));
  else if (li.launcher == "pmi" && env("PMI_KVSNAME")) li.job = "pmi-" + s(env("PMI_KVSNAME"));
  else if (li.launcher == "pmi" && env("PMI_JOBID")) li.job = "pmi-" + s(env("PMI_JOBID"));
  else if (env("TORCHELASTIC_RUN_ID") || (!li.master_addr.empty() && li.master_port != 0)) {
    // torchrun's run id defaults to "none" for every job, so the rendezvous address and port
    // (one job at a time can serve there) are part of the name, and so is the restart count
    // (an elastic restart is a new job with the same id). A rerun with the same variables
    // reuses the name: shm and the file store recognise and replace what a crashed run left.
    li.job = "torch";
    if (env("TORCHELASTIC_RUN_ID")) li.job += "-" + s(env("TORCHELASTIC_RUN_ID"));
    if (!li.master_addr.empty() && li.master_port != 0) li.job += "-" + li.master_addr + "-" + std::to_string(li.master_port);
    if (env("TORCHELASTIC_RESTART_COUNT")) li.job += "-r" + s(env("TORCHELASTIC_RESTART_COUNT"));
  }
  else
    throw error(errc::invalid_argument, "collx: found " + li.launcher +
                                            "'s rank and size but nothing that names the job; set COLLX_JOB "
                                            "(the same value on every rank of one job)");
  return li;
}

}  // namespace collx
