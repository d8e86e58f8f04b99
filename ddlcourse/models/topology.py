"""A fully convolutional U-Net (Ronneberger et al. 2015) for density prediction, in 2D and 3D.

Fully convolutional: no layer depends on the grid size, so a model trained on a 32x64 grid runs on a
64x128 grid unchanged (the lab's resolution transfer). Each side must be divisible by ``2**depth``.

GroupNorm instead of BatchNorm: its statistics are per sample, so the model computes the same thing on
1 or N ranks (BatchNorm would need SyncBatchNorm, which refuses CPU tensors).
"""
from __future__ import annotations

import torch
from torch import nn


def _conv(dim: int):
    return nn.Conv2d if dim == 2 else nn.Conv3d


def _block(dim: int, c_in: int, c_out: int) -> nn.Sequential:
    """Two (conv 3x3 -> GroupNorm -> GELU) layers."""
    conv = _conv(dim)
    groups = max(1, min(8, c_out // 4))
    return nn.Sequential(conv(c_in, c_out, 3, padding=1), nn.GroupNorm(groups, c_out), nn.GELU(),
                         conv(c_out, c_out, 3, padding=1), nn.GroupNorm(groups, c_out), nn.GELU())


class UNet(nn.Module):
    """``(batch, in_ch, *grid) -> (batch, 1, *grid)`` logits of the density; ``dim`` 2 or 3.

    ``width`` channels at full resolution, doubled at each of ``depth`` downsamplings.
    """

    def __init__(self, in_ch: int = 5, width: int = 16, depth: int = 3, dim: int = 2):
        super().__init__()
        if dim not in (2, 3):
            raise ValueError(f"dim must be 2 or 3, got {dim}")
        if depth < 1 or width < 1:
            raise ValueError(f"depth and width must be >= 1, got {depth}, {width}")
        self.dim, self.depth = dim, depth
        pool = nn.MaxPool2d if dim == 2 else nn.MaxPool3d
        up = nn.ConvTranspose2d if dim == 2 else nn.ConvTranspose3d
        chans = [width * 2**k for k in range(depth + 1)]
        self.down = nn.ModuleList([_block(dim, in_ch, chans[0])] +
                                  [_block(dim, chans[k - 1], chans[k]) for k in range(1, depth + 1)])
        self.pool = pool(2)
        self.up = nn.ModuleList([up(chans[k], chans[k - 1], 2, stride=2) for k in range(depth, 0, -1)])
        self.merge = nn.ModuleList([_block(dim, 2 * chans[k - 1], chans[k - 1]) for k in range(depth, 0, -1)])
        self.head = _conv(dim)(chans[0], 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = 2**self.depth
        if any(s % f for s in x.shape[2:]):
            raise ValueError(f"grid {tuple(x.shape[2:])} must be divisible by 2**depth = {f} in every direction")
        skips = []
        for k, block in enumerate(self.down):
            x = block(x if k == 0 else self.pool(x))
            skips.append(x)                                 # (batch, width * 2**k, grid / 2**k)
        x = skips.pop()
        for up, merge in zip(self.up, self.merge):
            x = merge(torch.cat([up(x), skips.pop()], dim=1))
        return self.head(x)                                 # (batch, 1, *grid)


def build(in_ch: int, width: int, depth: int, dim: int = 2) -> UNet:
    return UNet(in_ch=in_ch, width=width, depth=depth, dim=dim)


def n_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
