"""A 2-D process mesh: data parallelism across groups of ranks that use tensor parallelism inside the group.

``world_size = dp * tp`` ranks form a grid; rank ``r`` sits at ``(r // tp, r % tp)``::

            tp rank 0   tp rank 1
    dp 0    rank 0      rank 1        <- a tensor-parallel group (one model replica, split in two)
    dp 1    rank 2      rank 3
              ^ a data-parallel group (the same shard of the model, different data)

Tensor-parallel groups are neighbours (on a cluster: the same node, fast links), data-parallel groups are
strided (across nodes, where only one gradient allreduce per step crosses the slow network). This is the
layout of Megatron-LM's hybrid parallelism and of a torch ``DeviceMesh``. The groups come from
:mod:`ddlcourse.grid` (``grid.build(dp=dp, tp=tp)``: one ``torch.distributed.new_group`` per row and per column,
made once and cached), the package's one builder of process groups.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as tdist
from torch import nn

from ddlcourse import dist, grid
from ddlcourse.device import rank_device
from ddlcourse.parallel.tensor import ParallelMLP, serial_mlp


@dataclass
class Mesh2D:
    dp: int
    tp: int
    dp_rank: int
    tp_rank: int
    dp_group: object      # ranks holding the same model shard
    tp_group: object      # ranks sharing one model replica


def build_mesh(dp: int, tp: int) -> Mesh2D:
    """This rank's place and groups (collective: every rank of the world calls it; the groups are cached)."""
    n = tdist.get_world_size()
    if dp * tp != n:
        raise ValueError(f"dp * tp = {dp} * {tp} must equal the world size {n}")
    g = grid.build(dp=dp, tp=tp)
    return Mesh2D(dp, tp, g.coord("dp"), g.coord("tp"), g.group("dp"), g.group("tp"))


def layout(dp: int, tp: int) -> list[list[int]]:
    """The grid of global ranks: ``layout(dp, tp)[i][j]`` is the rank with dp rank i and tp rank j."""
    return grid.layout(dp=dp, tp=tp)


def hybrid_compare_with_serial(dp: int, tp: int, global_batch: int = 16, dim: int = 16, hidden: int = 32,
                               seed: int = 0, device=None) -> dict:
    """On every rank: one step of a tensor-parallel MLP (tp) trained data-parallel (dp) against serial.

    Everything lives on ``device`` (default: this rank's, ``dist.init().device``).
    Returns the largest differences of the loss and of this rank's weight-gradient slices, and its coordinates.
    """
    dist.init(horovod=False)
    device = rank_device(device)
    mesh = build_mesh(dp, tp)
    if global_batch % dp:
        raise ValueError(f"global_batch {global_batch} is not divisible by dp={dp}")
    # drawn with CPU generators (the same numbers on any device), then moved
    X = torch.randn(global_batch, dim, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    Y = torch.randn(global_batch, dim, generator=torch.Generator().manual_seed(seed + 2)).to(device)
    mlp = serial_mlp(dim, hidden, seed, device=device)
    ser_loss = nn.functional.mse_loss(mlp(X), Y)
    ser_loss.backward()

    pmlp = ParallelMLP(mlp[0], mlp[2], mesh.tp_group)    # the same split on every dp replica
    b = global_batch // dp
    xs, ys = X[mesh.dp_rank * b:(mesh.dp_rank + 1) * b], Y[mesh.dp_rank * b:(mesh.dp_rank + 1) * b]
    loss = nn.functional.mse_loss(pmlp(xs), ys)          # this replica's shard of the global batch
    loss.backward()
    for p in pmlp.parameters():                           # data parallelism: mean over the dp group only
        tdist.all_reduce(p.grad, group=mesh.dp_group)
        p.grad /= dp
    lt = loss.detach().reshape(1).clone()                 # on the device, float32 like the loss
    tdist.all_reduce(lt, group=mesh.dp_group)
    k = hidden // tp
    t = mesh.tp_rank
    d = max((pmlp.fc1.weight.grad - mlp[0].weight.grad[t * k:(t + 1) * k]).abs().max().item(),
            (pmlp.fc2.weight.grad - mlp[2].weight.grad[:, t * k:(t + 1) * k]).abs().max().item(),
            (pmlp.fc2.bias.grad - mlp[2].bias.grad).abs().max().item())
    return dict(rank=tdist.get_rank(), dp_rank=mesh.dp_rank, tp_rank=mesh.tp_rank,
                loss_diff=abs(lt.item() / dp - ser_loss.item()), grad_diff=d)
