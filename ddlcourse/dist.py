"""Per-rank setup: ranks from MPI, ``torch.distributed``, Horovod, the device and the seed.

Run on every rank (an ipyparallel engine, or a process under ``mpiexec``/``srun``)::

    from ddlcourse import dist
    info = dist.init()            # torch.distributed (gloo on CPU, nccl on GPU) + Horovod
    model.to(info.device)
    dist.seed_everything(1234)    # rank r gets seed 1234 + r, see seed_for_rank

Everything here is idempotent: calling ``init()`` twice returns the same setup.

The seeding rule, used throughout the course
-------------------------------------------
``seed_for_rank(base_seed, rank) = base_seed + 1000 * rank``. Model initialisation uses the *same*
seed on every rank (``rank=0``'s seed, or a broadcast from rank 0); anything that must differ per rank
(data augmentation, dropout, a rank's shard order) uses the rank's own seed. The large stride keeps
the streams of neighbouring ranks from overlapping when a caller adds small offsets (epoch, step).
"""
from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass

import numpy as np

SEED_STRIDE = 1000
_STATE: dict = {}


# --------------------------------------------------------------------------- ranks
def _comm():
    from mpi4py import MPI
    return MPI.COMM_WORLD


def rank() -> int:
    return _comm().Get_rank()


def world_size() -> int:
    return _comm().Get_size()


def local_rank() -> int:
    """Rank among the processes on this host.

    Read from the launcher when it says (Slurm, Open MPI, MPICH/Hydra), else computed with an MPI
    shared-memory split of COMM_WORLD.
    """
    for var in ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
                "MV2_COMM_WORLD_LOCAL_RANK", "PALS_LOCAL_RANKID"):
        v = os.environ.get(var)
        if v is not None and v.isdigit():
            return int(v)
    if "local_rank" not in _STATE:
        from mpi4py import MPI
        node = _comm().Split_type(MPI.COMM_TYPE_SHARED)
        _STATE["local_rank"] = node.Get_rank()
        node.Free()
    return _STATE["local_rank"]


def pick_device(local: int | None = None):
    """The GPU matching the local rank when CUDA is available, else the CPU."""
    import torch

    if torch.cuda.is_available():
        local = local_rank() if local is None else local
        idx = local % torch.cuda.device_count()
        torch.cuda.set_device(idx)
        return torch.device("cuda", idx)
    return torch.device("cpu")


def set_threads(n: int | None = None) -> int:
    """Threads per rank for torch; default ``$DDLCOURSE_THREADS`` (set by the launcher) or 1."""
    import torch

    n = int(n or os.environ.get("DDLCOURSE_THREADS") or os.environ.get("SLURM_CPUS_PER_TASK") or 1)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


# --------------------------------------------------------------------------- seeding
def seed_for_rank(base_seed: int, rank_: int) -> int:
    """The course's one seeding rule: ``base_seed + 1000 * rank``."""
    return int(base_seed) + SEED_STRIDE * int(rank_)


def seed_everything(base_seed: int, per_rank: bool = True) -> int:
    """Seed Python, NumPy and torch. ``per_rank=False`` gives every rank the same seed."""
    import torch

    s = seed_for_rank(base_seed, rank() if per_rank else 0)
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)
    return s


# --------------------------------------------------------------------------- torch.distributed + Horovod
@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: object
    backend: str
    host: str
    horovod: bool


def _rendezvous_address() -> tuple[str, int]:
    """Rank 0 picks a free TCP port on its host and broadcasts ``(address, port)``."""
    comm = _comm()
    addr = port = None
    if comm.Get_rank() == 0:
        hosts = comm.gather(socket.gethostname(), root=0)
        single_host = len(set(hosts)) == 1
        addr = "127.0.0.1" if single_host else os.environ.get("DDLCOURSE_MASTER_ADDR") or _routable_ip()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("" if not single_host else "127.0.0.1", 0))
            port = s.getsockname()[1]
    else:
        comm.gather(socket.gethostname(), root=0)
    return comm.bcast((addr, port), root=0)


def _routable_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def init(backend: str = "auto", horovod: bool = True, timeout_s: float = 300.0) -> DistInfo:
    """Initialise ``torch.distributed`` from the MPI world (and Horovod). Idempotent.

    ``backend``: ``"auto"`` (nccl with CUDA, else gloo), ``"gloo"`` or ``"nccl"``.
    """
    import datetime

    import torch
    import torch.distributed as tdist

    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"unknown backend {backend!r}; use 'auto', 'gloo' or 'nccl'")
    if "info" in _STATE:
        info = _STATE["info"]
        if horovod and not info.horovod:          # torch.distributed is up; Horovod asked for later
            _init_horovod(info.rank, info.world_size)
            info = _STATE["info"] = DistInfo(**{**info.__dict__, "horovod": True})
        return info
    set_threads()
    comm = _comm()
    r, n = comm.Get_rank(), comm.Get_size()
    device = pick_device()
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"unknown backend {backend!r}; use 'auto', 'gloo' or 'nccl'")
    if backend == "nccl" and device.type != "cuda":
        raise RuntimeError("backend 'nccl' needs a CUDA device, and this rank has none; use 'gloo'")
    if not tdist.is_initialized():
        addr, port = _rendezvous_address()
        kwargs = {"device_id": device} if backend == "nccl" else {}
        tdist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=r, world_size=n,
                                 timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    used_hvd = False
    if horovod:
        _init_horovod(r, n)
        used_hvd = True
    info = DistInfo(rank=r, world_size=n, local_rank=local_rank(), device=device, backend=backend,
                    host=socket.gethostname(), horovod=used_hvd)
    _STATE["info"] = info
    return info


def _init_horovod(r: int, n: int) -> None:
    try:
        import horovod.torch as hvd
    except ImportError as e:  # the course env always has it; a bare site may not
        raise RuntimeError("Horovod is not importable here; run 'make setup', or init(horovod=False)") from e
    hvd.init()
    if hvd.rank() != r or hvd.size() != n:
        raise RuntimeError(f"Horovod sees rank {hvd.rank()}/{hvd.size()}, MPI sees {r}/{n}")


def shutdown() -> None:
    """Undo :func:`init` (destroy the process group, shut Horovod down)."""
    import torch.distributed as tdist

    info = _STATE.pop("info", None)
    for comm, _ in _STATE.pop("subgroups", {}).values():
        if comm is not None:
            comm.Free()
    if tdist.is_initialized():
        tdist.destroy_process_group()
    if info is not None and info.horovod:
        import horovod.torch as hvd
        hvd.shutdown()


def describe() -> dict:
    """Rank, host, pid and device of this process (used by ``MPICluster.report``)."""
    import torch

    dev = pick_device()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return dict(rank=rank(), size=world_size(), host=socket.gethostname(), pid=os.getpid(),
                local_rank=local_rank(), device=str(dev) if dev.type == "cpu" else f"{dev} ({name})")


# --------------------------------------------------------------------------- small helpers used everywhere
def is_root() -> bool:
    return rank() == 0


def barrier() -> None:
    _comm().Barrier()


def allreduce_mean(x: float) -> float:
    """Mean of a Python number over all ranks (for metrics, not gradients)."""
    return _comm().allreduce(float(x)) / world_size()


def subgroup(k: int):
    """The first ``k`` ranks as their own world: ``(mpi_comm, torch_group)``; ``(None, None)`` on other ranks.

    Lets one N-rank cluster run the same experiment on 1, 2, ..., N ranks without restarting.
    Collective: every rank of COMM_WORLD must call it with the same ``k``. Groups are cached per ``k``.
    The torch group exists only after :func:`init`.
    """
    import torch.distributed as tdist

    n = world_size()
    if not 1 <= k <= n:
        raise ValueError(f"subgroup size must be between 1 and the world size {n}, got {k}")
    cache = _STATE.setdefault("subgroups", {})
    if k not in cache:
        r = rank()
        comm = _comm().Split(0 if r < k else 1, r)
        if r >= k:
            comm.Free()
            comm = None
        group = tdist.new_group(ranks=list(range(k))) if tdist.is_initialized() else None
        cache[k] = (comm, group if r < k else None)
    return cache[k]
