"""Data parallelism three ways, behind one call:

    model, optimizer = wrap(model, optimizer, backend="ddp")        # or "horovod", or "allreduce"

All three start every rank from rank 0's parameters and make every rank step with the **mean** of the
per-rank gradients, so that with equal per-rank batches a step equals one serial step on the global batch.

* ``allreduce`` -- hand-written: broadcast the parameters, then a hook on each parameter all-reduces its
  gradient as soon as backward has produced it (one message per tensor: the baseline the others beat).
* ``ddp``       -- ``torch.nn.parallel.DistributedDataParallel``: buckets gradients and overlaps their
  allreduce with the rest of backward.
* ``horovod``   -- ``hvd.DistributedOptimizer`` + ``broadcast_parameters``: tensor fusion, allreduce in
  a background thread.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as tdist
from torch import nn

from ddlcourse import bench, dist
from ddlcourse.data.toy import teacher_classification
from ddlcourse.device import rank_device
from ddlcourse.models.small import MLP
from ddlcourse.optim import RECIPES, broadcast_state, make_optimizer, state_tensors
from ddlcourse.parallel.mpi_hook import register_mpi_hook

BACKENDS = ("allreduce", "ddp", "horovod")


def broadcast_parameters(model: nn.Module, src: int = 0, group=None) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (step 3 of the five steps)."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            tdist.broadcast(t.data, src=src, group=group)


def average_gradients(model: nn.Module, group=None) -> None:
    """After ``backward()``: replace each gradient by its mean over the ranks of ``group``."""
    n = tdist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            tdist.all_reduce(p.grad, op=tdist.ReduceOp.SUM, group=group)
            p.grad.div_(n)


def average_grad_hook(p: torch.Tensor, group=None) -> None:
    """The hook of the hand-written way: replace ``p.grad`` by its mean over the ranks of ``group``, in place
    (a sum by allreduce, then a division by the number of ranks). Register it with
    ``p.register_post_accumulate_grad_hook``, so that it runs as soon as backward has produced ``p.grad``."""
    tdist.all_reduce(p.grad, op=tdist.ReduceOp.SUM, group=group)
    p.grad.div_(tdist.get_world_size(group))


def add_allreduce_hooks(model: nn.Module, group=None) -> list:
    """Average each gradient over the ranks as soon as it is accumulated (hand-written DDP, no buckets)."""
    def hook(p: torch.Tensor) -> None:
        average_grad_hook(p, group)

    return [p.register_post_accumulate_grad_hook(hook) for p in model.parameters() if p.requires_grad]


def wrap(model: nn.Module, optimizer: torch.optim.Optimizer, backend: str = "ddp", group=None,
         compression: str = "none", **ddp_kwargs):
    """Make ``model`` and ``optimizer`` data-parallel over the ranks of ``group`` (default: all).

    Returns ``(model, optimizer)``; call ``model(x)``, ``loss.backward()``, ``optimizer.step()`` as usual.
    ``compression="fp16"`` sends Horovod's gradients in half precision. Horovod always spans the whole world.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown data-parallel backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if compression not in ("none", "fp16"):
        raise ValueError(f"compression must be 'none' or 'fp16', got {compression!r}")
    if backend == "horovod":
        import horovod.torch as hvd  # lazy: Horovod is optional (not every install builds it)
        if group is not None:
            raise ValueError("the horovod backend spans all ranks; use 'ddp' or 'allreduce' for a subgroup")
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        comp = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=comp, op=hvd.Average)
        return model, optimizer
    if compression != "none":
        raise ValueError("compression is implemented for the horovod backend only")
    if backend == "ddp":
        dev = next(model.parameters()).device
        ids = [dev.index] if dev.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, process_group=group, **ddp_kwargs)
        if dev.type == "cpu":   # CPU buckets through MPI unless $DDLCOURSE_DDP_HOOK=default (GPU buckets keep NCCL)
            register_mpi_hook(ddp, group)
        return ddp, optimizer
    broadcast_parameters(model, group=group)
    model._ddl_hooks = add_allreduce_hooks(model, group)
    return model, optimizer


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside a DDP wrapper (for checkpoints and evaluation)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


# --------------------------------------------------------------------------- overlap, and the demos of notebooks 05-06
class OverlappingHooks:
    """Hooks that *start* each gradient's allreduce as soon as backward produces it (``async_op``), and
    a :meth:`wait` to call before ``optimizer.step()``. Communication of late layers then overlaps
    with the backward of early layers: the idea behind DDP, minus its buckets."""

    def __init__(self, model: nn.Module, group=None):
        self.n = tdist.get_world_size(group)
        self.group = group
        self.pending: list = []
        self.handles = [p.register_post_accumulate_grad_hook(self._hook)
                        for p in model.parameters() if p.requires_grad]

    def _hook(self, p: torch.Tensor) -> None:
        self.pending.append((tdist.all_reduce(p.grad, op=tdist.ReduceOp.SUM, group=self.group, async_op=True), p))

    def wait(self) -> None:
        for work, p in self.pending:
            work.wait()
            p.grad.div_(self.n)
        self.pending.clear()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def accumulate_step(ddp_model: nn.Module, micro_batches, optimizer: torch.optim.Optimizer, loss_fn) -> float:
    """One optimizer step of ``ddp_model`` (a ``DistributedDataParallel``) on this rank's share of the global
    batch, given as ``micro_batches``, k ``(x, y)`` pairs of equal size (gradient accumulation, notebook 06).

    Every backward but the last runs inside ``ddp_model.no_sync()``: the gradients add up in ``.grad`` and DDP
    all-reduces each bucket once, on the last backward. Each micro-batch's loss is divided by k, so the step is
    one step on the whole global batch. Returns this rank's mean loss over its micro-batches."""
    k = len(micro_batches)
    optimizer.zero_grad()
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        with ddp_model.no_sync() if i < k - 1 else nullcontext():
            loss = loss_fn(ddp_model(x), y) / k
            loss.backward()
        total += loss.item()
    optimizer.step()
    return total


WAYS = ("serial", "after_backward", "allreduce", "overlap", "ddp", "horovod")


def train_way(way: str, steps: int = 5, global_batch: int = 32, n_train: int = 512, dim: int = 16,
              hidden: int = 32, optimizer: str = "sgd", lr: float = 0.1, seed: int = 0,
              compression: str = "none", n_ranks: int | None = None, device=None) -> dict | None:
    """Train the same MLP on the same global batches one of :data:`WAYS`; runs on every rank.

    ``serial``: each rank trains on the whole global batch alone (the reference). Every other way
    splits each global batch into equal per-rank shares. ``n_ranks`` limits the run to the first
    ranks (not for horovod, which spans the world). Returns ``{"params", "losses"}`` on the ranks
    that took part (params as a flat NumPy array, losses of the global batch), None on the others.
    Model and batches live on ``device`` (default: the rank's, ``dist.init().device``).
    """
    if way not in WAYS:
        raise ValueError(f"unknown way {way!r}; choose one of {', '.join(WAYS)}")
    dist.init(horovod=(way == "horovod"))
    device = rank_device(device)
    group = None
    if n_ranks is not None and way != "serial":
        if way == "horovod" and n_ranks != dist.world_size():
            raise ValueError("the horovod way spans all ranks; leave n_ranks=None")
        comm, group = dist.subgroup(n_ranks)
        if comm is None:
            return None
    world = 1 if way == "serial" else tdist.get_world_size(group)
    r = 0 if way == "serial" else tdist.get_rank(group)
    if global_batch % world:
        raise ValueError(f"global_batch {global_batch} must be divisible by the {world} ranks")
    X, y = teacher_classification(n_train, dim=dim, n_classes=4, seed=seed)
    X, y = X.to(device), y.to(device)
    # Each rank initialises its own model differently on purpose: step 3 (broadcast) must fix that.
    # The serial reference uses rank 0's seed, the one the broadcast spreads.
    torch.manual_seed(dist.seed_for_rank(seed, 0 if way == "serial" else dist.rank()))
    model = MLP(dim, 4, hidden=hidden).to(device)
    opt = make_optimizer(optimizer, model.parameters(), lr)
    hooks = None
    if way in ("allreduce", "ddp", "horovod"):
        model, opt = wrap(model, opt, backend=way, group=group, compression=compression)
    elif way in ("after_backward", "overlap"):
        broadcast_parameters(model, group=group)
        hooks = OverlappingHooks(model, group) if way == "overlap" else None
    losses = []
    for step in range(steps):
        start = (step * global_batch) % n_train
        idx = (torch.arange(global_batch, device=device) + start) % n_train   # this step's global batch
        mine = idx[r::world]                                   # this rank's equal share
        loss = nn.functional.cross_entropy(model(X[mine]), y[mine])
        opt.zero_grad()
        loss.backward()
        if way == "after_backward":
            average_gradients(model, group)
        if hooks is not None:
            hooks.wait()
        opt.step()
        lg = loss.detach().clone()
        if world > 1:
            tdist.all_reduce(lg, group=group)
        losses.append(lg.item() / world)
    params = torch.cat([p.detach().flatten() for p in unwrap(model).parameters()]).cpu().numpy()
    return {"params": params, "losses": losses}


def time_way(way: str, steps: int = 10, micro_batch: int = 64, dim: int = 64, hidden: int = 256,
             depth: int = 4, warmup: int = 2, device=None) -> dict:
    """Median seconds per training step of an MLP on random data, one of :data:`WAYS` (not serial);
    the slowest rank's time, with the device synchronised before each clock read. Runs on every rank."""
    if way == "serial" or way not in WAYS:
        raise ValueError(f"time_way needs a parallel way, one of {', '.join(WAYS[1:])}")
    dist.init(horovod=(way == "horovod"))
    device = rank_device(device)
    torch.manual_seed(0)
    model = MLP(dim, 10, hidden=hidden, depth=depth).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    hooks = None
    if way in ("allreduce", "ddp", "horovod"):
        model, opt = wrap(model, opt, backend=way)
    else:
        broadcast_parameters(model)
        hooks = OverlappingHooks(model) if way == "overlap" else None
    g = torch.Generator().manual_seed(dist.seed_for_rank(1, dist.rank()))
    x = torch.randn(micro_batch, dim, generator=g).to(device)        # drawn on the CPU: the same numbers on any device
    t = torch.randint(0, 10, (micro_batch,), generator=g).to(device)

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), t).backward()
        if way == "after_backward":
            average_gradients(model)
        if hooks is not None:
            hooks.wait()
        opt.step()

    st = bench.time_steps(step, n_steps=steps, warmup=warmup, samples_per_step=micro_batch * dist.world_size(),
                          sync=dist.barrier, device=device)
    if hooks is not None:
        hooks.remove()
    n_params = sum(p.numel() for p in unwrap(model).parameters())
    return {"way": way, "seconds": dist._comm().allreduce(st.median, op=_mpi_max()), "n_params": n_params,
            "samples_per_s": st.samples_per_step / st.median}


def _mpi_max():
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    return MPI.MAX


# --------------------------------------------------------------------------- optimizer state across ranks (notebook 12)
def state_consistency(name: str = "lamb", steps: int = 3, perturb: bool = False, fix: bool = False,
                      seed: int = 0, device=None) -> dict:
    """Data-parallel training (DDP) with optimizer ``name``: do the ranks' optimizer states and parameters agree?

    ``perturb``: after the first step, rank 1 scales its optimizer state (as if it had resumed from another
    checkpoint). ``fix``: then :func:`ddlcourse.optim.broadcast_state` from rank 0. Runs on every rank; returns
    the largest difference across ranks of the state tensors and of the parameters after ``steps`` steps. Model
    and data live on ``device`` (default: the rank's, ``dist.init().device``). Notebook 12 runs it; it lives
    here, beside :func:`wrap`, because it trains data-parallel (``optim`` stays free of the parallel wrappers).
    """
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    info = dist.init(horovod=False)
    device = rank_device(device)
    X, y = teacher_classification(256, dim=8, n_classes=4, seed=seed)
    X, y = X.to(device), y.to(device)
    torch.manual_seed(seed)
    model = MLP(8, 4, hidden=16).to(device)
    opt = make_optimizer(name, model.parameters(), lr=RECIPES[name][0])
    model, opt = wrap(model, opt, backend="ddp")
    for step in range(steps):
        idx = torch.arange(step * 32, step * 32 + 32, device=device)[info.rank::info.world_size]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X[idx]), y[idx]).backward()
        opt.step()
        if step == 0 and perturb:
            if info.rank == 1:
                with torch.no_grad():
                    for v in state_tensors(opt):
                        if v.is_floating_point() and v.numel() > 1:
                            v.mul_(3.0)
            if fix:
                broadcast_state(opt)
    comm = dist._comm()

    def spread(tensors):
        # mpi4py reduces host buffers (unless the MPI is CUDA-aware): copy to the CPU first
        flat = torch.cat([t.detach().float().flatten() for t in tensors]).cpu().numpy()
        lo, hi = flat.copy(), flat.copy()
        comm.Allreduce(MPI.IN_PLACE, lo, op=MPI.MIN)
        comm.Allreduce(MPI.IN_PLACE, hi, op=MPI.MAX)
        return float((hi - lo).max())

    state = [v for v in state_tensors(opt) if v.numel() > 1]
    return {"state_spread": spread(state), "param_spread": spread(list(unwrap(model).parameters()))}
