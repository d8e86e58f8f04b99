"""Notebook 18 · a spatially split convolution (:mod:`ddlcourse.parallel.spatial`) against the serial one."""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from ddlcourse.device import rank_device
from ddlcourse.parallel.spatial import SpatialConv2d, SpatialConv3d, allreduce_spatial_grads, gather_spatial, scatter_spatial


def compare_with_serial(ndim: int = 2, size: int = 16, channels: int = 3, kernel: int = 3, dim: int = 2,
                        dilation: int = 1, pool: bool = True, seed: int = 0, group=None, device=None) -> dict:
    """Run on every rank of ``group``: a spatial conv (+ ReLU + local pool by 2) against the serial layers.

    Everything lives on ``device`` (default: this rank's). Returns the largest differences of the output, the
    input gradient and the weight gradient, each relative to the largest absolute value of the serial tensor.
    """
    device = rank_device(device)
    torch.manual_seed(seed)                       # same weights and input on every rank (drawn on the CPU)
    Conv = nn.Conv2d if ndim == 2 else nn.Conv3d
    conv = Conv(channels, 4, kernel, padding=dilation * (kernel - 1) // 2, dilation=dilation).to(device)
    x = torch.randn(2, channels, *([size] * ndim)).to(device).requires_grad_(True)   # (batch, C, *spatial)
    pool_fn = (F.max_pool2d if ndim == 2 else F.max_pool3d) if pool else (lambda t, k: t)

    def weights(t):                               # fixed loss weights: a non-trivial loss
        return torch.arange(t.numel(), device=device).reshape(t.shape).sin()

    y_ser = pool_fn(F.relu(conv(x)), 2)
    (y_ser * weights(y_ser)).sum().backward()
    gx_ser, gw_ser = x.grad.clone(), conv.weight.grad.clone()
    conv.zero_grad()

    x_loc = scatter_spatial(x.detach(), dim, group).requires_grad_(True)
    sconv = (SpatialConv2d if ndim == 2 else SpatialConv3d)(conv, dim=dim, group=group)
    y_loc = pool_fn(F.relu(sconv(x_loc)), 2)      # local pooling: local size is even
    y = gather_spatial(y_loc, dim, group)
    (y * weights(y)).sum().backward()
    allreduce_spatial_grads(sconv, group)
    gx = gather_spatial(x_loc.grad, dim, group)
    def rel(a, b):   # relative to the largest reference value: sums over big images grow with their size
        return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()

    return dict(out=rel(y, y_ser), grad_input=rel(gx, gx_ser), grad_weight=rel(conv.weight.grad, gw_ser))
