"""A DDP communication hook that all-reduces CPU gradient buckets through MPI: DDP at MPI speed on CPU ranks.

``DistributedDataParallel`` hands each gradient bucket to a *communication hook* once backward has filled it;
the default hook all-reduces it with the process group's backend. On CPU ranks that backend is gloo, which
talks TCP even between processes on one host: a small allreduce costs some hundreds of microseconds there,
against a few with MPICH's shared memory. This hook sends CPU buckets through MPI (mpi4py) instead::

    ddp = DistributedDataParallel(model, process_group=group)
    register_mpi_hook(ddp, group)     # True: CPU buckets now go through MPI; False: left on the default hook

:func:`ddlcourse.parallel.data_parallel.wrap` does this for ``backend="ddp"`` on CPU unless ``$DDLCOURSE_DDP_HOOK=default``. The hook computes what
DDP's default hook computes (each bucket divided by the group size, then summed over the group), so training
is unchanged; only the transport differs. GPU buckets keep the default hook (NCCL): mpi4py sends host memory,
and a GPU bucket would need a CUDA-aware MPI (notebook 08, the node and the network).

When MPI is used, as in :mod:`ddlcourse.parallel.syncbn`:

* MPI must be initialised with ``MPI_THREAD_MULTIPLE`` (mpi4py's default): Horovod's background thread, or a
  SyncBatchNorm layer, may be inside an MPI call of its own;
* the torch ranks must be the MPI ranks (``dist.init`` makes them so);
* the bucket is a contiguous float32/float64 CPU tensor (other dtypes take the default hook).

The MPI communicator with the ranks of the DDP group is built once per set of ranks (collectively, when the
hook is registered, which every rank of the group does), cached, and freed by :func:`free_comms`.

The hook is blocking: MPI_Allreduce returns when the bucket is reduced. On CPU ranks that costs no overlap
worth having (gloo's own background thread competes for the same cores), and it keeps the bucket order, which
DDP already makes the same on every rank.
"""
import os   # no `from __future__ import annotations`: DDP reads the hook's return annotation at run time

import torch
import torch.distributed as tdist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

MODE_VAR = "DDLCOURSE_DDP_HOOK"        # "mpi" (the default): CPU buckets through MPI; "default": DDP's own hook
_DTYPES = (torch.float32, torch.float64)
_COMMS: dict = {}                      # tuple of world ranks -> MPI communicator with those ranks (or None)


def mode() -> str:
    """``"mpi"`` (the default) or ``"default"`` (DDP's own hook), from ``$DDLCOURSE_DDP_HOOK``."""
    # On by default. `python -m ddlcourse.bench_ddp` on a quiet 2-core machine, 1.2 M-parameter MLP: 2 ranks,
    # DDP's step 0.99x Horovod's with the hook and 1.29-1.44x with gloo; 4 ranks on the 2 cores, 1.03x and
    # 1.96x. Only with ~15 other busy processes on the 2 cores was the blocking MPI_Allreduce slower than gloo.
    m = os.environ.get(MODE_VAR, "mpi").strip().lower()
    if m not in ("mpi", "default"):
        raise ValueError(f"${MODE_VAR} must be 'mpi' or 'default', got {m!r}")
    return m


def mpi_usable() -> str | None:
    """None when MPI can carry this process's collectives; else the reason it cannot."""
    try:
        from mpi4py import MPI
    except ImportError:
        return "mpi4py is not installed"
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return "MPI is not initialised (or already finalised)"
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        return "MPI was initialised without MPI_THREAD_MULTIPLE"
    if not tdist.is_initialized():
        return "torch.distributed is not initialised"
    world = MPI.COMM_WORLD
    if tdist.get_world_size() != world.Get_size() or tdist.get_rank() != world.Get_rank():
        return "the torch ranks are not the MPI ranks"
    return None


def comm_for(group=None):
    """The MPI communicator with the ranks of the torch ``group`` (None: the world), or None when MPI cannot
    serve it. Collective over the group's ranks the first time for each set of ranks; cached after that."""
    if mpi_usable() is not None:
        return None
    from mpi4py import MPI

    ranks = tuple(tdist.get_process_group_ranks(group if group is not None else tdist.group.WORLD))
    if ranks not in _COMMS:
        world = MPI.COMM_WORLD
        if ranks == tuple(range(world.Get_size())):
            _COMMS[ranks] = world.Dup()          # its own context: never mixed up with user messages
        else:
            everyone = world.Get_group()
            members = everyone.Incl(list(ranks))
            _COMMS[ranks] = world.Create_group(members)   # collective over the members only
            members.Free()
            everyone.Free()
    return _COMMS[ranks]


def free_comms() -> int:
    """Free every cached communicator (collective: call it on every rank that registered a hook). Returns how many."""
    n = 0
    for comm in _COMMS.values():
        if comm is not None:
            comm.Free()
            n += 1
    _COMMS.clear()
    return n


class MPIHookState:
    """What the hook needs: the torch group (for the fallback), its MPI communicator, and a count of the
    buckets each path carried (so a test or a learner can see which one ran)."""

    def __init__(self, process_group=None, comm=None):
        self.process_group = process_group
        self.comm = comm
        self.size = tdist.get_world_size(process_group)
        self.buckets = {"mpi": 0, "default": 0}


def mpi_allreduce_hook(state: "MPIHookState", bucket: tdist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average one gradient bucket over the group: through MPI for a CPU float bucket, else DDP's default hook."""
    buf = bucket.buffer()
    if state.comm is None or buf.device.type != "cpu" or buf.dtype not in _DTYPES or not buf.is_contiguous():
        state.buckets["default"] += 1
        return default_hooks.allreduce_hook(state.process_group, bucket)
    from mpi4py import MPI

    buf.div_(state.size)                                   # as the default hook: divide first, then sum
    state.comm.Allreduce(MPI.IN_PLACE, buf.numpy(), op=MPI.SUM)   # numpy() shares the bucket's memory
    state.buckets["mpi"] += 1
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def register_mpi_hook(ddp: torch.nn.parallel.DistributedDataParallel, group=None, force: bool = False) -> bool:
    """Register :func:`mpi_allreduce_hook` on ``ddp`` (whose process group is ``group``) when MPI can serve the
    group and ``$DDLCOURSE_DDP_HOOK`` is not ``default``. Returns True when registered, False when DDP keeps its
    default hook. Every rank of the group must call it (it may build the group's communicator)."""
    if not force and mode() != "mpi":          # force: a demo or benchmark that asks for the hook itself
        return False
    if next(ddp.module.parameters()).device.type != "cpu":
        return False                                       # GPU buckets: NCCL, untouched
    comm = comm_for(group)
    if comm is None:
        return False
    state = MPIHookState(group, comm)
    ddp.register_comm_hook(state, mpi_allreduce_hook)
    ddp._ddl_hook_state = state
    return True


def hook_state(ddp) -> "MPIHookState | None":
    """The :class:`MPIHookState` registered on ``ddp`` by :func:`register_mpi_hook`, or None."""
    return getattr(ddp, "_ddl_hook_state", None)


# --------------------------------------------------------------------------- the demo of notebook 07 (runtimes)
HOOKS = ("default", "mpi", "fp16")


def compare_hooks(steps: int = 4, global_batch: int = 32, hidden: int = 64, time_steps: int = 10, group=None,
                  device=None) -> dict:
    """Train one MLP with DDP three ways on the ranks of ``group`` and compare with serial: DDP's default hook
    (gloo on CPU), this module's MPI hook, and torch's ``fp16_compress_hook`` (gradients sent in half precision).

    Returns ``{hook: {"max_diff": |params - serial|, "seconds": median s/step (slowest rank), "buckets": ...}}``.
    Runs on every rank of ``group`` (the MPI hook falls back to the default one on a GPU: NCCL).
    """
    from mpi4py import MPI

    from ddlcourse import bench, dist
    from ddlcourse.data.toy import teacher_classification
    from ddlcourse.device import rank_device
    from ddlcourse.models.small import MLP

    dist.init(horovod=False)
    device = rank_device(device)
    world, r = tdist.get_world_size(group), tdist.get_rank(group)
    X, y = teacher_classification(4 * global_batch, dim=16, n_classes=4, seed=2)
    X, y = X.to(device), y.to(device)
    comm = comm_for(group)
    comm = comm if comm is not None else MPI.COMM_WORLD

    def train(hook: str | None):
        torch.manual_seed(0)
        model = MLP(16, 4, hidden=hidden).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.2)
        state = None
        if hook is not None:
            ids = [device.index] if device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, process_group=group)
            if hook == "mpi":
                register_mpi_hook(model, group, force=True)
                state = hook_state(model)
            elif hook == "fp16":
                model.register_comm_hook(group, default_hooks.fp16_compress_hook)
        n, me = (1, 0) if hook is None else (world, r)

        def step(s):
            idx = (torch.arange(global_batch, device=device) + s * global_batch) % X.shape[0]
            mine = idx[me::n]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(X[mine]), y[mine]).backward()
            opt.step()

        for s in range(steps):
            step(s)
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        secs = None
        if hook is not None:
            st = bench.time_steps(lambda: step(0), n_steps=time_steps, warmup=1, sync=comm.Barrier, device=device)
            secs = comm.allreduce(st.median, op=MPI.MAX)
        return params, secs, state

    serial, _, _ = train(None)
    out = {}
    for hook in HOOKS:
        p, secs, state = train(hook)
        out[hook] = {"max_diff": comm.allreduce((p - serial).abs().max().item(), op=MPI.MAX), "seconds": secs,
                     "buckets": None if state is None else dict(state.buckets)}
    return out
