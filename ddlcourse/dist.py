"""Per-rank setup: ranks from MPI, ``torch.distributed``, Horovod, the device and the seed.

Run on every rank (an ipyparallel engine, or a process under ``mpiexec``/``srun``)::

    from ddlcourse import dist
    info = dist.init()            # torch.distributed (gloo on CPU; on GPU one group: cpu:gloo,cuda:nccl)
    dist.init(horovod=True)       # ... and Horovod too, for the code that uses it
    model.to(info.device)         # every model and tensor a rank uses lives on info.device
    dist.seed_everything(1234)    # rank r gets seed 1234 + 1000 * r, see seed_for_rank

Everything here is idempotent: calling ``init()`` twice returns the same setup.

``init()`` refuses, with a message that says what to do, the launches that would otherwise train wrongly
without a word: a world of size 1 where the launcher started N processes (a wrong ``srun --mpi`` plugin),
GPUs requested but CUDA unusable, and more ranks on a node than it has GPUs (:class:`LaunchError`). Where a
rank runs (its local rank and device) is read by :mod:`ddlcourse.cluster.placement`.

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
from ddlcourse.cluster.placement import LaunchError, check_launch, gpu_uuid, local_rank, pick_device, shared_gpu

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


def init(backend: str = "auto", horovod: bool = False, timeout_s: float = 300.0, tf32: bool = False) -> DistInfo:
    """Initialise ``torch.distributed`` from the MPI world, and Horovod with ``horovod=True``. Idempotent: a later
    call with ``horovod=True`` adds Horovod to a world that has only ``torch.distributed``.

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
    _agree_or_raise(comm, shared_gpu(comm.allgather((socket.gethostname(), gpu_uuid(device))), r))
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
        raise RuntimeError("Horovod is not importable here; run 'make setup', or init()") from e
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
    init()
    _, group = subgroup(k)
    return together(fn, args, dict(kwargs, group=group), run=group is not None)
