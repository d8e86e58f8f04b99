"""DDP communication hooks that all-reduce CPU gradient buckets through MPI: DDP at MPI speed on CPU ranks.

``DistributedDataParallel`` hands each gradient bucket to a *communication hook* once backward has filled it;
the default hook all-reduces it with the process group's backend. On CPU ranks that backend is gloo, which
talks TCP even between processes on one host: a small allreduce costs some hundreds of microseconds there,
against a few with MPICH's shared memory. These hooks send CPU buckets through MPI (mpi4py) instead::

    ddp = DistributedDataParallel(model, process_group=group)
    register_mpi_hook(ddp, group)     # True: CPU buckets (and buffers) now go through MPI; False: DDP's own hooks

:func:`ddlcourse.parallel.data_parallel.wrap` does this for ``backend="ddp"`` on CPU. ``$DDLCOURSE_DDP_HOOK``
picks the mode (:data:`MODES`):

* ``mpi-overlap`` (the default): each bucket's allreduce is *started* (``MPI_Iallreduce``, in place) and the
  hook returns a pending future at once, so backward goes on computing the next buckets while this one travels,
  as Horovod's background thread lets it. When the hook is handed the last bucket it waits for all of them
  (``MPI_Waitall``) and completes their futures in bucket order, so DDP finds them done when backward ends;
* ``mpi``: each bucket is reduced by a blocking ``MPI_Allreduce`` inside the hook; backward waits for it;
* ``default``: DDP's own hook (gloo on CPU). Nothing is registered.

Either MPI mode computes what DDP's default hook computes (each bucket divided by the group size, then summed
over the group), so training is unchanged; only the transport differs. It also registers a *buffer* hook:
DDP's broadcast of rank 0's buffers (BatchNorm's running statistics) before every forward goes through
``MPI_Bcast`` instead of gloo. GPU buckets keep the default hook (NCCL): mpi4py sends host memory, and a GPU
bucket would need a CUDA-aware MPI (notebook 08, the node and the network).

When MPI is used, as in :mod:`ddlcourse.parallel.syncbn`:

* MPI must be initialised with ``MPI_THREAD_MULTIPLE`` (mpi4py's default): Horovod's background thread, or a
  SyncBatchNorm layer, may be inside an MPI call of its own;
* the torch ranks must be the MPI ranks (``dist.init`` makes them so);
* the bucket is a contiguous float32/float64 CPU tensor (other dtypes take the default hook);
* every rank of the group starts the same buckets in the same order (DDP makes it so), because MPI matches
  collectives on a communicator by their order. Join (uneven inputs) shadows only the default hook: use
  ``default`` with it.

The MPI communicator with the ranks of the DDP group is :mod:`ddlcourse.grid`'s, under the hook's own tag, built once
per set of ranks (collectively, when the hook is registered, which every rank of the group does) and freed by
:func:`free_comms` or ``dist.shutdown``. Requests
posted on it are recorded per communicator until they are waited for; a backward that raised half-way leaves
some behind, and the next forward of a DDP module with the hook (or :func:`free_comms`) waits for them first,
so that no request is left un-waited and a later bucket is never matched with a stale one.
"""
import os   # no `from __future__ import annotations`: DDP reads the hook's return annotation at run time

import torch
import torch.distributed as tdist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel.distributed import _BufferCommHookLocation

from ddlcourse import grid

MODE_VAR = "DDLCOURSE_DDP_HOOK"
MODES = ("mpi-overlap", "mpi", "default")     # the first is the default
_DTYPES = (torch.float32, torch.float64)
_BUFFER_BUCKET_BYTES = 250 * 1024 * 1024      # DDP's own broadcast_bucket_size, for buffers MPI does not carry
HOOK_TAG = "ddp-hook"                  # the hook's communicators in ddlcourse.grid's cache
_PENDING: dict = {}                    # tuple of world ranks -> [(request, future, bucket buffer)] not yet waited


def check_mode(m: str) -> str:
    """``m`` normalised, or a ValueError that lists the modes."""
    m = str(m).strip().lower()
    if m not in MODES:
        raise ValueError(f"${MODE_VAR} must be one of {', '.join(repr(x) for x in MODES)}, got {m!r}")
    return m


def mode() -> str:
    """The hook mode from ``$DDLCOURSE_DDP_HOOK``: ``"mpi-overlap"`` when unset, else one of :data:`MODES`."""
    # Timed with `python -m ddlcourse bench-ddp` on a shared 2-core machine (figures there; they depend on the
    # machine and its load): both MPI modes beat gloo; the overlapping one comes closest to Horovod.
    return check_mode(os.environ.get(MODE_VAR, MODES[0]))


def _ranks(group) -> tuple:
    return tuple(tdist.get_process_group_ranks(group if group is not None else tdist.group.WORLD))


def comm_for(group=None):
    """The MPI communicator with the ranks of the torch ``group`` (None: the world), or None when MPI cannot
    serve it (:func:`ddlcourse.grid.mpi_usable`). It is the grid's, under the hook's own tag: the hook's
    non-blocking allreduces never share a communicator with anything else. Collective over the group's ranks the
    first time for each set of ranks; cached after that."""
    return grid.comm_for_group(group, HOOK_TAG)


def wait_pending(ranks: tuple) -> int:
    """Wait for every request posted on the communicator of ``ranks`` and complete its future with the reduced
    bucket, in the order posted. Returns how many there were (0: nothing was in flight)."""
    pending = _PENDING.get(ranks)
    if not pending:
        return 0
    from mpi4py import MPI

    items = list(pending)
    pending.clear()                  # cleared first: a request is waited for once, even if Waitall raises
    MPI.Request.Waitall([req for req, _, _ in items])
    for _, fut, buf in items:
        fut.set_result(buf)
    return len(items)


def _wait_all(tag) -> None:
    """Before the grid frees the hook's communicators: wait for every request still in flight on them."""
    if tag in (None, HOOK_TAG):
        for ranks in list(_PENDING):
            wait_pending(ranks)
        _PENDING.clear()


grid.before_release(_wait_all)


def free_comms() -> int:
    """Wait for what is still in flight, then free the hook's communicators (collective: call it on every rank
    that registered a hook; ``dist.shutdown`` frees them too). Returns how many communicators were freed."""
    return grid.release(HOOK_TAG)


class MPIHookState:
    """What the hooks need: the torch group (for the fallback), its MPI communicator, the mode, and counts of what
    each path carried, so that a test or a learner can see which one ran:

    * ``buckets``: gradient buckets by path, ``"mpi-overlap"`` (started with ``MPI_Iallreduce``), ``"mpi"``
      (blocking ``MPI_Allreduce``) or ``"default"`` (handed to DDP's hook: a bucket MPI cannot carry);
    * ``buffer_syncs``: buffer broadcasts by transport, ``"mpi"`` or ``"default"`` (one per dtype per forward);
    * ``waits``: the ``MPI_Waitall`` calls at the last bucket; ``leftovers``: requests of an interrupted
      backward that a later forward waited for.
    """

    def __init__(self, process_group=None, comm=None, mode: str = MODES[0]):
        self.process_group = process_group
        self.comm = comm
        self.mode = check_mode(mode)
        self.size = tdist.get_world_size(process_group)
        self.ranks = _ranks(process_group)
        self.pending = _PENDING.setdefault(self.ranks, [])     # shared by every hook on this communicator
        self.buckets = {m: 0 for m in MODES}
        self.buffer_syncs = {"mpi": 0, "default": 0}
        self.waits = 0
        self.leftovers = 0

    @property
    def mpi_buckets(self) -> int:
        """Gradient buckets that went through MPI, in either mode."""
        return self.buckets["mpi"] + self.buckets["mpi-overlap"]

    def wait_pending(self) -> int:
        return wait_pending(self.ranks)


def _mpi_carries(state: MPIHookState, buf: torch.Tensor) -> bool:
    return state.comm is not None and buf.device.type == "cpu" and buf.dtype in _DTYPES and buf.is_contiguous()


def _default_hook(state: MPIHookState, bucket: tdist.GradBucket):
    state.buckets["default"] += 1
    return default_hooks.allreduce_hook(state.process_group, bucket)


def mpi_allreduce_hook(state: "MPIHookState", bucket: tdist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Mode ``mpi``: average one gradient bucket over the group with a blocking ``MPI_Allreduce`` (a CPU float
    bucket), else DDP's default hook. Returns a future that is already done."""
    buf = bucket.buffer()
    if not _mpi_carries(state, buf):
        return _default_hook(state, bucket)
    from mpi4py import MPI

    buf.div_(state.size)                                   # as the default hook: divide first, then sum
    state.comm.Allreduce(MPI.IN_PLACE, buf.numpy(), op=MPI.SUM)   # numpy() shares the bucket's memory
    state.buckets["mpi"] += 1
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def mpi_overlap_hook(state: "MPIHookState", bucket: tdist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Mode ``mpi-overlap``: start the bucket's allreduce (``MPI_Iallreduce`` in place) and return its future
    undone; backward goes on while MPI reduces it. At the last bucket, wait for all of them and complete their
    futures, so that DDP, which waits for every bucket's future when backward ends, finds them done.

    DDP starts the buckets in index order, the same on every rank, and calls the hook of the last one last, so
    every request of this backward is waited for before backward returns."""
    buf = bucket.buffer()
    if _mpi_carries(state, buf):
        from mpi4py import MPI

        buf.div_(state.size)                               # as the default hook: divide first, then sum
        fut = torch.futures.Future()
        req = state.comm.Iallreduce(MPI.IN_PLACE, buf.numpy(), op=MPI.SUM)   # buf must stay put until waited
        state.pending.append((req, fut, buf))
        state.buckets["mpi-overlap"] += 1
    else:
        fut = _default_hook(state, bucket)
    if bucket.is_last():
        state.waits += 1
        state.wait_pending()
    return fut


def mpi_broadcast_buffers_hook(state: "MPIHookState", named_buffers: dict) -> None:
    """DDP's buffer hook, run before each forward: copy rank 0's buffers (``{name: tensor}``) to every rank of
    the group, as DDP's own broadcast does, through ``MPI_Bcast``: one message per dtype (float running
    statistics, an int64 batch counter), sent as bytes. Buffers off the CPU go through the process group.
    (The forward pre-hook that :func:`register_mpi_hook` adds has already waited for any stale request.)"""
    by_dtype: dict = {}
    for t in named_buffers.values():
        by_dtype.setdefault(t.dtype, []).append(t)
    for ts in by_dtype.values():
        if state.comm is None or any(t.device.type != "cpu" for t in ts):
            group = state.process_group if state.process_group is not None else tdist.group.WORLD
            tdist._broadcast_coalesced(group, ts, _BUFFER_BUCKET_BYTES, 0)
            state.buffer_syncs["default"] += 1
            continue
        shared = len(ts) == 1 and ts[0].is_contiguous()
        flat = ts[0].view(-1) if shared else torch.cat([t.reshape(-1) for t in ts])   # (total elements,)
        state.comm.Bcast(flat.view(torch.uint8).numpy(), root=0)    # bytes: any dtype, bool and bfloat16 too
        if not shared and state.comm.Get_rank() != 0:
            offset = 0
            for t in ts:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
        state.buffer_syncs["mpi"] += 1
    return None


def _wait_before_forward(state: MPIHookState):
    def pre_hook(_module, _args) -> None:
        state.leftovers += state.wait_pending()
    return pre_hook


def register_mpi_hook(ddp: torch.nn.parallel.DistributedDataParallel, group=None,
                      hook_mode: str | None = None) -> bool:
    """Register the MPI hooks on ``ddp`` (whose process group is ``group``) in ``hook_mode`` (None: from
    ``$DDLCOURSE_DDP_HOOK``), when MPI can serve the group and the mode is not ``default``: the gradient hook of
    the mode, the buffer broadcast through MPI, and a forward pre-hook that waits for requests an interrupted
    backward left. Returns True when registered, False when DDP keeps its own hooks. Every rank of the group
    must call it (it may build the group's communicator)."""
    m = mode() if hook_mode is None else check_mode(hook_mode)
    if m == "default":
        return False
    if next(ddp.module.parameters()).device.type != "cpu":
        return False                                       # GPU buckets: NCCL, untouched
    comm = comm_for(group)
    if comm is None:
        return False
    state = MPIHookState(group, comm, m)
    ddp.register_comm_hook(state, mpi_overlap_hook if m == "mpi-overlap" else mpi_allreduce_hook)
    ddp._register_buffer_comm_hook(state, mpi_broadcast_buffers_hook,
                                   comm_hook_location=_BufferCommHookLocation.PRE_FORWARD)
    ddp.register_forward_pre_hook(_wait_before_forward(state))
    ddp._ddl_hook_state = state
    return True


def hook_state(ddp) -> "MPIHookState | None":
    """The :class:`MPIHookState` registered on ``ddp`` by :func:`register_mpi_hook`, or None."""
    return getattr(ddp, "_ddl_hook_state", None)


# --------------------------------------------------------------------------- the demo of notebook 07 (runtimes)
HOOKS = ("default", "mpi", "mpi-overlap", "fp16")

