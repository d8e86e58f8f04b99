"""Notebook 19 · a 2-D mesh: tensor parallelism inside each row of a :mod:`ddlcourse.grid`, data parallelism down
its columns, against serial.

``world_size = dp * tp`` ranks form ``grid.build(dp=dp, tp=tp)``; rank ``r`` sits at ``(r // tp, r % tp)``::

            tp rank 0   tp rank 1
    dp 0    rank 0      rank 1        <- a tensor-parallel group (one model replica, split in two)
    dp 1    rank 2      rank 3
              ^ a data-parallel group (the same shard of the model, different data)

Tensor-parallel groups are neighbours (on a cluster: the same node, fast links), data-parallel groups are
strided (across nodes, where only one gradient allreduce per step crosses the slow network). This is the
layout of Megatron-LM's hybrid parallelism and of a torch ``DeviceMesh``.
"""
from __future__ import annotations

import torch
from torch import nn
import torch.distributed as tdist

from ddlcourse import dist, grid
from ddlcourse.device import rank_device
from ddlcourse.experiments.tensor import serial_mlp
from ddlcourse.parallel.tensor import ParallelMLP


def hybrid_compare_with_serial(dp: int, tp: int, global_batch: int = 16, dim: int = 16, hidden: int = 32,
                               seed: int = 0, device=None) -> dict:
    """On every rank: one step of a tensor-parallel MLP (tp) trained data-parallel (dp) against serial.

    Everything lives on ``device`` (default: this rank's, ``dist.init().device``).
    Returns the largest differences of the loss and of this rank's weight-gradient slices, and its coordinates.
    """
    dist.init()
    device = rank_device(device)
    if dp * tp != tdist.get_world_size():
        raise ValueError(f"dp * tp = {dp} * {tp} must equal the world size {tdist.get_world_size()}")
    g = grid.build(dp=dp, tp=tp)
    dp_group, tp_group = g.group("dp"), g.group("tp")     # collective: every rank, in this order
    dp_rank, tp_rank = g.coord("dp"), g.coord("tp")
    if global_batch % dp:
        raise ValueError(f"global_batch {global_batch} is not divisible by dp={dp}")
    # drawn with CPU generators (the same numbers on any device), then moved
    X = torch.randn(global_batch, dim, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    Y = torch.randn(global_batch, dim, generator=torch.Generator().manual_seed(seed + 2)).to(device)
    mlp = serial_mlp(dim, hidden, seed, device=device)
    ser_loss = nn.functional.mse_loss(mlp(X), Y)
    ser_loss.backward()

    pmlp = ParallelMLP(mlp[0], mlp[2], tp_group)    # the same split on every dp replica
    b = global_batch // dp
    xs, ys = X[dp_rank * b:(dp_rank + 1) * b], Y[dp_rank * b:(dp_rank + 1) * b]
    loss = nn.functional.mse_loss(pmlp(xs), ys)          # this replica's shard of the global batch
    loss.backward()
    for p in pmlp.parameters():                           # data parallelism: mean over the dp group only
        tdist.all_reduce(p.grad, group=dp_group)
        p.grad /= dp
    lt = loss.detach().reshape(1).clone()                 # on the device, float32 like the loss
    tdist.all_reduce(lt, group=dp_group)
    k = hidden // tp
    t = tp_rank
    d = max((pmlp.fc1.weight.grad - mlp[0].weight.grad[t * k:(t + 1) * k]).abs().max().item(),
            (pmlp.fc2.weight.grad - mlp[2].weight.grad[:, t * k:(t + 1) * k]).abs().max().item(),
            (pmlp.fc2.bias.grad - mlp[2].bias.grad).abs().max().item())
    return dict(rank=tdist.get_rank(), dp_rank=dp_rank, tp_rank=tp_rank,
                loss_diff=abs(lt.item() / dp - ser_loss.item()), grad_diff=d)
