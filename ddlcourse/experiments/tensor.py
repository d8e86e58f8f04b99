"""Notebook 18 · the Megatron MLP of :mod:`ddlcourse.parallel.tensor` against the serial MLP."""
from __future__ import annotations

import torch
from torch import nn
import torch.distributed as tdist

from ddlcourse.device import rank_device
from ddlcourse.parallel.tensor import ColumnParallelLinear, ParallelMLP


def serial_mlp(dim: int = 16, hidden: int = 64, seed: int = 0, device=None) -> nn.Sequential:
    """``Linear -> GELU -> Linear``, initialised on the CPU (the same weights on any device), on ``device``
    (default: this rank's)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)).to(rank_device(device))


def compare_with_serial(batch: int = 8, dim: int = 16, hidden: int = 64, group=None, seed: int = 0,
                        device=None) -> dict:
    """Run on every rank of ``group``: ParallelMLP against the serial MLP, and a gathered column layer.

    Everything lives on ``device`` (default: this rank's).
    Returns the largest differences of the output, the input gradient and this rank's weight-gradient slices.
    """
    device = rank_device(device)
    r, t = tdist.get_rank(group), tdist.get_world_size(group)
    mlp = serial_mlp(dim, hidden, seed, device=device)
    # drawn with CPU generators (the same numbers on any device), then moved
    x = torch.randn(batch, dim, generator=torch.Generator().manual_seed(seed + 1)).to(device).requires_grad_(True)
    w_out = torch.randn(batch, dim, generator=torch.Generator().manual_seed(seed + 2)).to(device)   # loss weights
    (mlp(x) * w_out).sum().backward()
    gx_ser = x.grad.clone()
    x.grad = None
    pmlp = ParallelMLP(mlp[0], mlp[2], group)
    y = pmlp(x)
    (y * w_out).sum().backward()
    k1, k2 = hidden // t, hidden // t
    diffs = dict(
        out=(y - mlp(x)).abs().max().item(),
        grad_input=(x.grad - gx_ser).abs().max().item(),
        grad_w1=(pmlp.fc1.weight.grad - mlp[0].weight.grad[r * k1:(r + 1) * k1]).abs().max().item(),
        grad_b1=(pmlp.fc1.bias.grad - mlp[0].bias.grad[r * k1:(r + 1) * k1]).abs().max().item(),
        grad_w2=(pmlp.fc2.weight.grad - mlp[2].weight.grad[:, r * k2:(r + 1) * k2]).abs().max().item(),
        grad_b2=(pmlp.fc2.bias.grad - mlp[2].bias.grad).abs().max().item(),
    )
    # a column layer that gathers its output equals the serial layer
    col = ColumnParallelLinear(mlp[0], group, gather_output=True)
    diffs["gathered"] = (col(x.detach()) - mlp[0](x.detach())).abs().max().item()
    return diffs
