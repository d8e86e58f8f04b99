"""Small models for the concept notebooks."""
from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Sequential):
    """``in_dim -> hidden -> ... -> out_dim`` with ReLU; ``depth`` hidden layers."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int = 64, depth: int = 2):
        layers, d = [], in_dim
        for _ in range(depth):
            layers += [nn.Linear(d, hidden), nn.ReLU()]
            d = hidden
        layers.append(nn.Linear(d, out_dim))
        super().__init__(*layers)


class SmallCNN(nn.Module):
    """Two conv blocks (conv-BN-ReLU-pool) and a linear head. ``norm=None`` drops batch norm."""

    def __init__(self, in_ch: int = 1, n_classes: int = 3, width: int = 16, norm: type[nn.Module] | None = nn.BatchNorm2d):
        super().__init__()

        def block(ci, co):
            return [nn.Conv2d(ci, co, 3, padding=1, bias=norm is None),
                    norm(co) if norm else nn.Identity(), nn.ReLU(), nn.MaxPool2d(2)]

        self.features = nn.Sequential(*block(in_ch, width), *block(width, 2 * width))
        self.head = nn.Linear(2 * width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, in_ch, H, W)
        h = self.features(x)                               # (batch, 2*width, H/4, W/4)
        return self.head(h.mean(dim=(2, 3)))               # global average pool -> (batch, n_classes)
