"""Per-rank setup: ranks from MPI, ``torch.distributed``, Horovod, the device and the seed.

Run on every rank (an ipyparallel engine, or a process under ``mpiexec``/``srun``)::

    from ddlcourse import dist
    info = dist.init()            # torch.distributed (gloo on CPU; on GPU one group: cpu:gloo,cuda:nccl) + Horovod
    model.to(info.device)         # every model and tensor a rank uses lives on info.device
    dist.seed_everything(1234)    # rank r gets seed 1234 + 1000 * r, see seed_for_rank

Everything here is idempotent: calling ``init()`` twice returns the same setup.

``init()`` refuses, with a message that says what to do, the launches that would otherwise train wrongly
without a word: a world of size 1 where the launcher started N processes (a wrong ``srun --mpi`` plugin),
GPUs requested but CUDA unusable, and more ranks on a node than it has GPUs (:class:`LaunchError`).

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

from ddlcourse import grid

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


class LaunchError(RuntimeError):
    """The processes were started in a way that cannot train correctly (wrong launcher or device setup)."""


# Launcher variables that give this process's rank among the processes of its host. Each is trusted only
# when the launcher's own rank/size variables beside it match the MPI world (an inherited variable does not).
_LOCAL_RANK_VARS = (
    # (local rank, world rank, world size)
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),   # Open MPI
    ("MPI_LOCALRANKID", "PMI_RANK", "PMI_SIZE"),                                        # MPICH hydra
    ("PMI_LOCAL_RANK", "PMI_RANK", "PMI_SIZE"),                                         # PMI-2/PMIx
    ("MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),      # MVAPICH2
    ("PALS_LOCAL_RANKID", "PALS_RANKID", None),                                         # Cray PALS
)


def _env_int(name: str | None) -> int | None:
    v = os.environ.get(name) if name else None
    return int(v) if v is not None and v.strip().isdigit() else None


def _srun_step_matches(r: int, n: int) -> bool:
    """True when this process is task ``r`` of an ``srun`` step of ``n`` tasks (so SLURM_LOCALID is ours).

    Under ``mpiexec`` inside ``salloc``/``sbatch`` every rank inherits the batch step's SLURM_LOCALID=0 and
    SLURM_PROCID=0: the rank or size then disagrees with MPI's, and the Slurm variables are not used.
    """
    return (_env_int("SLURM_LOCALID") is not None and _env_int("SLURM_PROCID") == r
            and _env_int("SLURM_STEP_NUM_TASKS") == n)


def _local_rank_from_launcher(r: int, n: int) -> tuple[int | None, str]:
    """``(local rank, source)`` from the launcher that really started this process, or ``(None, "")``."""
    if _srun_step_matches(r, n):
        return _env_int("SLURM_LOCALID"), "SLURM_LOCALID"
    for local, rank_var, size_var in _LOCAL_RANK_VARS:
        lr = _env_int(local)
        if lr is None or lr >= n:
            continue
        if _env_int(rank_var) != r or (size_var and _env_int(size_var) != n):
            continue
        return lr, local
    return None, ""


def local_rank() -> int:
    """Rank among the processes on this host.

    From the launcher that actually started the process: Slurm's SLURM_LOCALID only in an ``srun`` step
    whose task id and task count match the MPI rank and size, else the MPI launcher's own variable (Open
    MPI, MPICH/Hydra, PMI, MVAPICH2, Cray PALS) when its rank and size match, else an MPI shared-memory
    split of COMM_WORLD (computed once; collective the first time, which :func:`init` is).
    """
    comm = _comm()
    value, _ = _local_rank_from_launcher(comm.Get_rank(), comm.Get_size())
    if value is not None:
        return value
    if "local_rank" not in _STATE:
        from mpi4py import MPI
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        _STATE["local_rank"] = node.Get_rank()
        node.Free()
    return _STATE["local_rank"]


def check_launch() -> None:
    """Refuse an MPI world of one process when the launcher started several (a wrong PMI plugin).

    With the wrong ``srun --mpi=`` plugin, srun starts N processes that each see an MPI world of size 1:
    every one is "rank 0 of 1", every check agrees with itself, and a training job trains N copies.
    """
    n = _comm().Get_size()
    if n != 1:
        return
    said = {v: _env_int(v) for v in ("SLURM_STEP_NUM_TASKS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")}
    if _env_int("SLURM_PROCID") is None:      # SLURM_STEP_NUM_TASKS speaks for this process only in a step
        said.pop("SLURM_STEP_NUM_TASKS")
    many = {k: v for k, v in said.items() if v is not None and v > 1}
    if many:
        k, v = next(iter(many.items()))
        raise LaunchError(
            f"MPI sees a world of 1 process, but the launcher started {v} ({k}={v}): each process is running "
            "alone as 'rank 0 of 1'. Under srun the PMI plugin does not match this MPI: use "
            "`srun --mpi=pmi2` for the course venv's MPICH (the templates read $DDLCOURSE_SRUN_MPI; "
            "`srun --mpi=list` shows what the site offers: pmix for Open MPI 5, cray_shasta for Cray MPICH), "
            "or start the ranks with the venv's mpiexec. See env/slurm/README.md.")


def _gpus_requested() -> str | None:
    """Why this job looks like it asked for GPUs (for the error when CUDA is unusable), or None."""
    g = os.environ.get("SLURM_GPUS_ON_NODE", "").strip()
    if g.isdigit() and int(g) > 0:
        return f"SLURM_GPUS_ON_NODE={g}"
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if cvd and cvd not in ("-1", "NoDevFiles") and not cvd.startswith("-"):
        return f"CUDA_VISIBLE_DEVICES={cvd}"
    return None


def pick_device(local: int | None = None, set_current: bool = True):
    """The GPU matching the local rank when CUDA is available, else the CPU.

    ``set_current``: make that GPU the process's current CUDA device (a rank does, once, in :func:`init`); a
    notebook's own kernel, which only asks which device a rank would use, does not.

    Raises :class:`LaunchError` when the job asked for GPUs but CUDA is unusable here (a CPU build of
    torch, a driver too old), rather than training on the CPU without a word; set
    ``DDLCOURSE_ALLOW_CPU=1`` to accept the CPU anyway.
    """
    import torch

    if torch.cuda.is_available():
        local = local_rank() if local is None else local
        count = torch.cuda.device_count()
        if count == 1:
            # One visible GPU: the launcher bound a GPU to this rank (srun --gpus-per-task=1, a site that binds
            # GPUs per task) or the node has one. Either way it is cuda:0; init() checks that no two ranks of a
            # node got the same one (by UUID), which catches the second case.
            idx = 0
        elif local >= count and os.environ.get("DDLCOURSE_SHARE_GPUS") != "1":
            raise LaunchError(
                f"local rank {local} on {socket.gethostname()} has no GPU of its own: this node shows {count} "
                f"GPU(s) and at least {local + 1} ranks. Start at most {count} ranks per node (e.g. "
                f"--ntasks-per-node={count}), or set DDLCOURSE_SHARE_GPUS=1 to let ranks share GPUs on purpose.")
        else:
            idx = local % count
        if set_current:
            torch.cuda.set_device(idx)
        return torch.device("cuda", idx)
    why = _gpus_requested()
    if why and os.environ.get("DDLCOURSE_ALLOW_CPU") != "1":
        build = (f"this torch {torch.__version__} is a CPU-only build" if torch.version.cuda is None else
                 f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use the GPU: "
                 "check the driver (nvidia-smi) against that CUDA version")
        raise LaunchError(
            f"the job asked for GPUs ({why}) but CUDA is not usable here: {build}. Use the GPU environment "
            "(environment.yml, env/GPU_CLUSTER.md), or set DDLCOURSE_ALLOW_CPU=1 to run on the CPU on purpose.")
    return torch.device("cpu")


def _gpu_uuid(device) -> str | None:
    """The UUID of this rank's GPU (None on the CPU): the same GPU has one UUID whatever index a rank sees."""
    import torch

    if getattr(device, "type", None) != "cuda":
        return None
    return str(torch.cuda.get_device_properties(device).uuid)


def shared_gpu(seen: list[tuple[str, str | None]], me: int) -> str | None:
    """Why rank ``me`` shares its GPU with another rank of its node, or None.

    ``seen[r]`` is rank r's ``(host, GPU UUID)``. Ranks that share a GPU run at a fraction of its speed and
    memory; ``DDLCOURSE_SHARE_GPUS=1`` allows it on purpose."""
    host, uuid = seen[me]
    if uuid is None or os.environ.get("DDLCOURSE_SHARE_GPUS") == "1":
        return None
    same = [r for r, (h, u) in enumerate(seen) if h == host and u == uuid]
    if len(same) < 2:
        return None
    return (f"ranks {same} on {host} all use GPU {uuid}: the launcher gave them the same GPU. Bind one GPU per "
            "task (srun --gpus-per-task=1) or show each rank all of the node's GPUs (srun --gpu-bind=none), "
            "start at most one rank per GPU, or set DDLCOURSE_SHARE_GPUS=1 to share GPUs on purpose.")


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


def _ipv4_interfaces() -> list[tuple[str, str, str]]:
    """``(interface, address, netmask)`` of this host's IPv4 addresses that are not loopback."""
    import psutil

    out = []
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                out.append((name, a.address, a.netmask or "255.255.255.255"))
    return out


def _same_subnet(a: str, b: str, mask: str) -> bool:
    import ipaddress
    net = ipaddress.IPv4Network(f"{a}/{mask}", strict=False)
    return ipaddress.IPv4Address(b) in net


def rendezvous_address(hosts: list[str], interfaces: list[list[tuple[str, str, str]]]) -> str:
    """The address rank 0 listens on: loopback on one host, else one the other hosts can reach.

    ``hosts[r]`` and ``interfaces[r]`` are rank r's hostname and IPv4 interfaces. On several hosts, rank
    0's address that shares a subnet with every other host, and that no other host has too (docker0's
    172.17.0.1 is on every node), is chosen: a cluster's node network, never 127.x. Where no subnet is
    shared (a routed network), rank 0's first such address is used; ``$DDLCOURSE_MASTER_ADDR`` overrides.
    """
    if len(set(hosts)) == 1:
        return "127.0.0.1"
    forced = os.environ.get("DDLCOURSE_MASTER_ADDR")
    if forced:
        return forced
    mine = interfaces[0]
    others = [iface for h, iface in zip(hosts, interfaces) if h != hosts[0]]
    taken = {a for o in others for _, a, _ in o}   # e.g. docker0's 172.17.0.1 on every node: not ours alone
    for _, addr, mask in mine:
        if addr not in taken and all(any(_same_subnet(addr, o_addr, mask) for _, o_addr, _ in o) for o in others):
            return addr
    for _, addr, _ in mine:
        if addr not in taken:
            return addr
    raise LaunchError(f"rank 0 on {hosts[0]} has no network address other than loopback, so ranks on "
                      f"{sorted(set(hosts) - {hosts[0]})} cannot reach it; set DDLCOURSE_MASTER_ADDR")


def _interface_towards(addr: str, interfaces: list[tuple[str, str, str]]) -> str | None:
    """This host's interface on the same subnet as ``addr`` (for gloo's GLOO_SOCKET_IFNAME)."""
    for name, mine, mask in interfaces:
        if mine == addr or _same_subnet(mine, addr, mask):
            return name
    return None


def _store(comm, timeout):
    """A TCPStore for the process group: rank 0 listens on a port the OS picks and broadcasts it.

    Binding port 0 and passing the number on (rather than probing for a free port, closing it and hoping
    it is still free) has no race when tests or jobs start in parallel.
    """
    from torch.distributed import TCPStore

    r, n = comm.Get_rank(), comm.Get_size()
    host = socket.gethostname()
    ifaces = _ipv4_interfaces()
    hosts = comm.allgather(host)
    all_ifaces = comm.allgather(ifaces)
    addr = rendezvous_address(hosts, all_ifaces) if r == 0 else None
    addr = comm.bcast(addr, root=0)
    if len(set(hosts)) > 1 and "GLOO_SOCKET_IFNAME" not in os.environ:
        # gloo finds its own address from the hostname, which often resolves to 127.0.1.1: point it at the
        # interface on the node network instead.
        name = _interface_towards(addr, ifaces)
        if name:
            os.environ["GLOO_SOCKET_IFNAME"] = name
    store = port = None
    err = None
    if r == 0:
        try:
            store = TCPStore(addr, 0, n, is_master=True, timeout=timeout, wait_for_workers=False)
            port = store.port
        except Exception as e:          # tell the other ranks, rather than leaving them waiting
            err = f"rank 0 could not listen on {addr}: {e}"
    port, err = comm.bcast((port, err), root=0)
    if err:
        raise LaunchError(err)
    if r != 0:
        store = TCPStore(addr, port, n, is_master=False, timeout=timeout)
    _STATE["rendezvous"] = (addr, port)
    return store


def rendezvous() -> tuple[str, int] | None:
    """The ``(address, port)`` the process group met at (after :func:`init`)."""
    return _STATE.get("rendezvous")


def _agree_or_raise(comm, problem: str | None) -> None:
    """Collective: if any rank found a problem, every rank raises it (no rank is left waiting)."""
    problems = [p for p in comm.allgather(problem) if p]
    if problems:
        raise LaunchError(problems[0] if len(set(problems)) == 1 else "; ".join(sorted(set(problems))))


def init(backend: str = "auto", horovod: bool = True, timeout_s: float = 300.0, tf32: bool = False) -> DistInfo:
    """Initialise ``torch.distributed`` from the MPI world (and Horovod). Idempotent.

    ``backend``: ``"auto"`` (nccl with CUDA, else gloo), ``"gloo"`` or ``"nccl"``. With nccl the default
    group is ``"cpu:gloo,cuda:nccl"``: CUDA tensors go through NCCL and CPU tensors through gloo, so a
    helper that all-reduces a CPU number still works on a GPU node. ``DistInfo.backend`` says ``nccl``.

    ``tf32``: on CUDA, TF32 matrix products are off by default, because the course compares distributed
    results with serial ones to 1e-5 and TF32 rounds inputs to 10 mantissa bits. Pass ``tf32=True`` for speed.
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
    check_launch()
    set_threads()
    comm = _comm()
    r, n = comm.Get_rank(), comm.Get_size()
    local = local_rank()
    device = problem = None
    try:
        device = pick_device(local)
    except LaunchError as e:
        problem = str(e)
    _agree_or_raise(comm, problem)
    _agree_or_raise(comm, shared_gpu(comm.allgather((socket.gethostname(), _gpu_uuid(device))), r))
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    _agree_or_raise(comm, "backend 'nccl' needs a CUDA device on every rank; use 'gloo'"
                    if backend == "nccl" and device.type != "cuda" else None)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    if not tdist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        store = _store(comm, timeout)
        if backend == "nccl":
            tdist.init_process_group("cpu:gloo,cuda:nccl", store=store, rank=r, world_size=n,
                                     timeout=timeout, device_id=device)
        else:
            tdist.init_process_group(backend, store=store, rank=r, world_size=n, timeout=timeout)
    used_hvd = False
    if horovod:
        _init_horovod(r, n)
        used_hvd = True
    info = DistInfo(rank=r, world_size=n, local_rank=local, device=device, backend=backend,
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
    """Undo :func:`init` (destroy the process group, shut Horovod down).

    First a garbage collection: FSDP and DDP wrappers sit in reference cycles, so they outlive the function
    that made them until the collector runs. Left to the interpreter's exit, they are torn down after the
    process group, with gloo's threads still holding their work, and the process can abort ("terminate called
    without an active exception", seen once in CI after a correct FSDP run).
    """
    import gc

    import torch.distributed as tdist

    gc.collect()

    info = _STATE.pop("info", None)
    grid.release()                  # the cached groups and communicators go with the world they were made in
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


class PeerFailed(RuntimeError):
    """Another rank raised inside :func:`together`; its own error is on that rank."""


def together(fn, args: tuple = (), kwargs: dict | None = None, *, run: bool = True):
    """``fn(*args, **kwargs)`` on this rank (nothing where ``run`` is False), then a collective check that it
    succeeded on every rank; returns its result (None where it did not run).

    A rank whose ``fn`` raised re-raises its own error; every other rank raises :class:`PeerFailed` naming the
    ranks that failed. Without the check, one rank's bad input leaves the others waiting forever in the next
    collective (a notebook cell that never returns). Collective: every rank must call it.
    """
    err, out = None, None
    try:
        out = fn(*args, **(kwargs or {})) if run else None
    except Exception as e:  # noqa: BLE001 - re-raised below, after the other ranks heard of it
        err = e
    failed = [r for r, bad in enumerate(_comm().allgather(err is not None)) if bad]
    if err is not None:
        raise err
    if failed:
        name = getattr(fn, "__name__", repr(fn))
        raise PeerFailed(f"{name} raised on rank(s) {failed} (their error is in their output); "
                         f"rank {rank()} stops too instead of waiting for them")
    return out


def allreduce_mean(x: float) -> float:
    """Mean of a Python number over all ranks (for metrics, not gradients)."""
    return _comm().allreduce(float(x)) / world_size()


def subgroup(k: int):
    """The first ``k`` ranks as their own world: ``(mpi_comm, torch_group)``; ``(None, None)`` on other ranks.

    Lets one N-rank cluster run the same experiment on 1, 2, ..., N ranks without restarting. Both come from
    :mod:`ddlcourse.grid` (a one-axis grid over the first ``k`` ranks), which caches them. Collective: every
    rank of COMM_WORLD calls it with the same ``k`` (the communicator is made by the first ``k`` ranks, the torch
    group by all). The torch group exists only after :func:`init` (None before).
    """
    import torch.distributed as tdist

    n = world_size()
    if not 1 <= k <= n:
        raise ValueError(f"subgroup size must be between 1 and the world size {n}, got {k}")
    g = grid.build(first=k, dp=k)
    comm = g.comm("dp")
    group = g.group("dp") if tdist.is_initialized() else None
    return comm, group


def on_first_ranks(k: int, fn, *args, **kwargs):
    """On every rank of the world: ``fn(*args, **kwargs)`` on the first ``k`` ranks, None on the others.

    ``fn`` gets the first ``k`` ranks as ``group=`` (a ``torch.distributed`` group; ``torch.distributed`` is
    initialised first), or, when it takes ``comm`` and no ``group``, as ``comm=`` (an mpi4py communicator). Lets
    a notebook with one N-rank cluster run a scheme on 2, 3, ... N ranks. Collective (:func:`subgroup`): every
    rank must call it. If ``fn`` raises on some rank, every rank raises (:func:`together`).
    """
    import inspect

    params = inspect.signature(fn).parameters
    if "comm" in params and "group" not in params:
        comm, _ = subgroup(k)
        return together(fn, args, dict(kwargs, comm=comm), run=comm is not None)
    init(horovod=False)
    _, group = subgroup(k)
    return together(fn, args, dict(kwargs, group=group), run=group is not None)
