"""collx as a torch.distributed backend.

    import collx_torch                      # builds the extension on first use, registers "collx"
    import torch.distributed as dist
    dist.init_process_group("collx", init_method="env://")   # or file://, tcp://; torchrun, mpirun

Ranks on one host talk over shared memory. On several hosts, a host's ranks talk over shared
memory and hosts over TCP (transport::two_level; tcp alone when each host has one rank);
COLLX_TORCH_TRANSPORT=shm|tcp|two_level forces one. The rendezvous is torch's store. new_group() splits the world (no new rendezvous).
"""
import datetime
import os

import torch
import torch.distributed as dist

from ._build import load as _load

def _env_from_launcher():
    """Under mpirun or srun (which set their own variables, not torch's), fills RANK, WORLD_SIZE,
    LOCAL_RANK and LOCAL_WORLD_SIZE for init_method="env://"; on one host also MASTER_ADDR
    (127.0.0.1) and, unless given, MASTER_PORT (from the launcher's job id, so every rank agrees)."""
    e = os.environ
    if "RANK" in e and "WORLD_SIZE" in e:
        return
    for rank, size, lrank, lsize, job in (
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid"),
            ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_JOBID"),
            ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID")):
        if rank in e and size in e:
            e["RANK"], e["WORLD_SIZE"] = e[rank], e[size]
            e.setdefault("LOCAL_RANK", e.get(lrank, "0"))
            e.setdefault("LOCAL_WORLD_SIZE", e.get(lsize, e[size]))
            if e.get("LOCAL_WORLD_SIZE") == e["WORLD_SIZE"]:
                e.setdefault("MASTER_ADDR", "127.0.0.1")
                digits = "".join(ch for ch in e.get(job, "") if ch.isdigit())
                if digits:
                    e.setdefault("MASTER_PORT", str(20000 + int(digits) % 30000))
            return


_env_from_launcher()
_ext = _load()
ProcessGroupCollx = _ext.ProcessGroupCollx


class Options:
    """The collx process group's options, passed as init_process_group's (or new_group's) pg_options:

        dist.init_process_group("collx", pg_options=collx_torch.Options(deterministic=True, wire="bf16"))

    deterministic: every floating reduction's result is the ranks' inputs added in rank order,
        rounded once, the same bits whatever the bucket layout (docs/precision.md); None leaves
        COLLX_DETERMINISTIC's choice. A group is deterministic as the world is.
    wire: "bf16" or "mxfp8": float32 SUM and AVG all-reduces send their data compressed, summed in
        float at every receiver (collx::algo::compressed); "none" sends float; None leaves
        COLLX_WIRE's choice (a group: its parent's).
    """

    def __init__(self, deterministic=None, wire=None):
        if wire not in (None, "none", "bf16", "mxfp8"):
            raise ValueError(f"collx_torch.Options: wire={wire!r}: none, bf16 or mxfp8")
        self.deterministic = deterministic
        self.wire = wire


def _options(pg_options):
    if pg_options is None:
        return -1, ""
    if not isinstance(pg_options, Options):
        raise TypeError(f"collx: pg_options must be a collx_torch.Options, not {type(pg_options).__name__}")
    det = -1 if pg_options.deterministic is None else int(bool(pg_options.deterministic))
    return det, pg_options.wire or ""


def _create(opts, pg_options=None):
    """The creator torch calls for init_process_group (the world) and for every new_group."""
    timeout = opts.timeout
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    members = list(opts.global_ranks_in_group)
    parent = None
    if members:
        world = dist.distributed_c10d._get_default_group()
        if isinstance(world, ProcessGroupCollx):
            parent = world
    det, wire = _options(pg_options)
    if parent is None:
        return ProcessGroupCollx(opts.store, opts.group_rank, opts.group_size, timeout, det, wire)
    return ProcessGroupCollx(opts.store, opts.group_rank, opts.group_size, parent, members, str(opts.group_id), det, wire)


if "COLLX" not in dist.Backend._plugins:
    dist.Backend.register_backend("collx", _create, extended_api=True)

__all__ = ["ProcessGroupCollx", "Options"]
