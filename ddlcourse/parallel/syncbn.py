"""Synchronized batch normalization built on allreduce: works on CPU (MPI or gloo) and GPU (nccl).

``torch.nn.SyncBatchNorm`` and Horovod's ``SyncBatchNorm`` refuse CPU tensors, so the course writes its
own. The idea fits in two lines:

* forward:  the batch statistics are those of the **global** batch, so every rank all-reduces
  ``[count, sum]`` per channel, then ``sum((x - mean)**2)`` (two small allreduces of C numbers each);
* backward: the input gradient of batch norm needs two global sums, ``sum(dy)`` and ``sum(dy * xhat)``,
  so the backward all-reduces those two (one allreduce of 2C numbers).

With ``y = w * xhat + b`` and ``xhat = (x - mean) / sqrt(var + eps)`` over the M samples of all ranks::

    dx = w / sqrt(var + eps) * (dy - sum(dy) / M - xhat * sum(dy * xhat) / M)

The weight and bias gradients stay local sums (``sum(dy * xhat)``, ``sum(dy)``): the data-parallel
gradient averaging that follows (DDP, Horovod, :mod:`ddlcourse.parallel.data_parallel`) adds them up.

Usage::

    from ddlcourse.parallel.syncbn import convert_sync_batchnorm
    model = convert_sync_batchnorm(model)            # every nn.BatchNorm*d -> SyncBatchNorm
    model = convert_sync_batchnorm(model, group=g)   # statistics over the ranks of a subgroup only

Without ``torch.distributed`` initialised (or with a group of one rank) it is an ordinary BatchNorm,
computed by the same code, which is how the tests compare it with ``nn.BatchNorm*d``.

Which allreduce: a batch-norm layer sends a few hundred bytes, twice forward and once backward, so what counts is
latency. On CPU tensors the small allreduces go through MPI (mpi4py, on a communicator with the ranks of the
torch group) when the torch ranks are the MPI ranks, as :func:`ddlcourse.dist.init` makes them: with MPICH's
shared memory that takes a few microseconds, against some 400 with gloo over TCP, which made SyncBatchNorm cost
more than the whole convolution work of a small U-Net. GPU tensors go through ``torch.distributed`` (NCCL).
``ALLREDUCE = "torch"`` forces torch.distributed everywhere (the tests compare both paths).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn import functional as F

from ddlcourse import grid


def _group_size(group) -> int:
    if not (tdist.is_available() and tdist.is_initialized()):
        return 1
    return tdist.get_world_size(group)


ALLREDUCE = "auto"          # "auto": MPI for CPU tensors where it maps onto the group; "torch": always torch


def _allreduce_(t: torch.Tensor, group) -> torch.Tensor:
    """Sum ``t`` in place over the ranks of ``group`` (a no-op on a single process)."""
    if _group_size(group) > 1:
        comm = grid.comm_for_group(group) if ALLREDUCE == "auto" and t.device.type == "cpu" and t.is_contiguous() else None
        if comm is not None:
            from mpi4py import MPI
            comm.Allreduce(MPI.IN_PLACE, t.detach().numpy(), op=MPI.SUM)   # numpy() shares t's memory
        else:
            tdist.all_reduce(t, op=tdist.ReduceOp.SUM, group=group)
    return t


def _reduce_dims(x: torch.Tensor) -> list[int]:
    """Every dimension but the channel one: (N, C), (N, C, L), (N, C, H, W), (N, C, D, H, W)."""
    return [0] + list(range(2, x.dim()))


def _per_channel(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Reshape a (C,) vector so that it broadcasts against x: (1, C, 1, ...)."""
    return v.view(1, -1, *([1] * (x.dim() - 2)))


def global_batch_stats(x: torch.Tensor, group=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mean, biased var, count)`` per channel over the samples of every rank in ``group``.

    Two passes (mean first, then squared deviations) rather than ``E[x^2] - E[x]^2``, which loses
    digits when the mean is large against the spread. Statistics are kept in float32 or better.
    """
    dims = _reduce_dims(x)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xs = x.to(acc)
    C = x.shape[1]
    local = torch.empty(C + 1, dtype=acc, device=x.device)
    local[0] = x.numel() // C if x.numel() else 0          # samples per channel on this rank
    local[1:] = xs.sum(dims) if x.numel() else 0
    _allreduce_(local, group)                              # [M, sum_0 .. sum_C-1] over ranks
    count = local[0]                                       # stays a tensor: no device-to-host copy per layer
    if count.device.type == "cpu" and count < 1:           # on the host already: checking is free
        raise ValueError("SyncBatchNorm got an empty global batch; every step needs at least one sample")
    # On a GPU the check would stall the stream in every layer; an empty global batch gives NaN statistics there.
    mean = local[1:] / count                               # (C,)
    sq = ((xs - _per_channel(mean, xs)) ** 2).sum(dims) if x.numel() else torch.zeros(C, dtype=acc, device=x.device)
    var = _allreduce_(sq, group) / count                   # (C,) biased variance of the global batch
    return mean, var, count


class SyncBatchNormFunction(torch.autograd.Function):
    """Batch norm over the global batch of a process group, with a hand-written backward."""
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group):
        mean, var, count = global_batch_stats(x, group)
        invstd = torch.rsqrt(var + eps)                    # (C,)
        xhat = (x.to(mean.dtype) - _per_channel(mean, x)) * _per_channel(invstd, x)
        y = xhat * _per_channel(weight.to(mean.dtype), x) + _per_channel(bias.to(mean.dtype), x)
        if running_mean is not None:
            # like nn.BatchNorm: running var uses the unbiased estimate of the global batch
            # (torch.where rather than `if count > 1`: no device-to-host sync on a GPU)
            unbiased = torch.where(count > 1, var * count / (count - 1).clamp(min=1), var)
            running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
            running_var.mul_(1 - momentum).add_(momentum * unbiased.to(running_var.dtype))
        ctx.save_for_backward(xhat, weight, invstd, count)
        ctx.group = group
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xhat, weight, invstd, count = ctx.saved_tensors
        dims = _reduce_dims(dy)
        dy32 = dy.to(xhat.dtype)
        C = xhat.shape[1]
        local = torch.empty(2 * C, dtype=xhat.dtype, device=dy.device)
        local[:C] = dy32.sum(dims) if dy.numel() else 0                  # d bias (this rank)
        local[C:] = (dy32 * xhat).sum(dims) if dy.numel() else 0         # d weight (this rank)
        grad_bias, grad_weight = local[:C].clone(), local[C:].clone()
        glob = _allreduce_(local, ctx.group)                             # the same sums over all ranks
        mean_dy = _per_channel(glob[:C] / count, xhat)
        mean_dy_xhat = _per_channel(glob[C:] / count, xhat)
        scale = _per_channel(weight.to(xhat.dtype) * invstd, xhat)
        dx = scale * (dy32 - mean_dy - xhat * mean_dy_xhat)
        return (dx.to(dy.dtype), grad_weight.to(weight.dtype), grad_bias.to(weight.dtype),
                None, None, None, None, None)


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Drop-in for ``nn.BatchNorm1d/2d/3d`` whose training statistics span the ranks of ``group``.

    Accepts any input of shape (N, C, ...). In eval mode (with running statistics) it is a plain
    per-rank batch norm, exactly like ``nn.BatchNorm``: nothing is communicated.
    """
    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, group=None,
                 device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.group = group

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects input of shape (N, C, ...), got {x.dim()}-D {tuple(x.shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if x.shape[1] != self.num_features:
            raise ValueError(f"expected {self.num_features} channels in dim 1, got shape {tuple(x.shape)}")
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        factor = 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            # momentum=None: cumulative moving average, as in nn.BatchNorm
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        update = self.training and self.track_running_stats
        w = self.weight if self.affine else torch.ones(self.num_features, device=x.device, dtype=x.dtype)
        b = self.bias if self.affine else torch.zeros(self.num_features, device=x.device, dtype=x.dtype)
        return SyncBatchNormFunction.apply(x, w, b, self.running_mean if update else None,
                                           self.running_var if update else None, self.eps, factor, self.group)

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.group is None else ", group=<subgroup>")


def convert_sync_batchnorm(module: nn.Module, group=None) -> nn.Module:
    """Replace every ``nn.BatchNorm1d/2d/3d`` inside ``module`` by :class:`SyncBatchNorm` (in place).

    Parameters, running statistics, ``num_batches_tracked`` and the train/eval mode carry over.
    Returns the converted module (a new object when ``module`` itself is a batch norm).
    """
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, SyncBatchNorm):
        ref = module.running_mean if module.running_mean is not None else module.weight
        new = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, group=group,
                            device=ref.device if ref is not None else None,
                            dtype=ref.dtype if ref is not None else None)
        with torch.no_grad():
            if module.affine:
                new.weight.copy_(module.weight)
                new.bias.copy_(module.bias)
                new.weight.requires_grad_(module.weight.requires_grad)
                new.bias.requires_grad_(module.bias.requires_grad)
            if module.track_running_stats:
                new.running_mean.copy_(module.running_mean)
                new.running_var.copy_(module.running_var)
                new.num_batches_tracked.copy_(module.num_batches_tracked)
        new.train(module.training)
        return new
    for name, child in module.named_children():
        new_child = convert_sync_batchnorm(child, group)
        if new_child is not child:
            setattr(module, name, new_child)
    return module


# --------------------------------------------------------------------------- the experiments of notebook 11

