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

import torch
import torch.distributed as tdist
from torch import nn

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


def add_allreduce_hooks(model: nn.Module, group=None) -> list:
    """Average each gradient over the ranks as soon as it is accumulated (hand-written DDP, no buckets)."""
    n = tdist.get_world_size(group)

    def hook(p: torch.Tensor) -> None:
        tdist.all_reduce(p.grad, op=tdist.ReduceOp.SUM, group=group)
        p.grad.div_(n)

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
        import horovod.torch as hvd
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
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, process_group=group, **ddp_kwargs), optimizer
    broadcast_parameters(model, group=group)
    model._ddl_hooks = add_allreduce_hooks(model, group)
    return model, optimizer


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside a DDP wrapper (for checkpoints and evaluation)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
