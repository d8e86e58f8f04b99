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

from ddlcourse import dist
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
        dist.init(horovod=True)      # idempotent: adds Horovod to the rank's setup if it is not there yet
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


# --------------------------------------------------------------------------- optimizer state across ranks (notebook 12)
