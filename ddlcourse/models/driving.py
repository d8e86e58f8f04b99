"""A multi-camera clip classifier: one (2+1)D convolutional encoder per view, fused by a small head.

(2+1)D convolutions (Tran et al. 2018) factor a 3x3x3 convolution into a 1x3x3 spatial one followed by a
3x1x1 temporal one: fewer parameters, and a nonlinearity between space and time. GroupNorm instead of
BatchNorm keeps every sample independent of the others, so data-parallel runs equal serial runs exactly
at any per-rank batch (SyncBatchNorm, notebook 11, is the alternative when BatchNorm is wanted).
"""
from __future__ import annotations

import torch
from torch import nn


def conv2plus1d(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv3d(c_in, c_out, (1, 3, 3), padding=(0, 1, 1), bias=False),   # space
        nn.GroupNorm(min(4, c_out), c_out), nn.ReLU(),
        nn.Conv3d(c_out, c_out, (3, 1, 1), padding=(1, 0, 0), bias=False),  # time
        nn.GroupNorm(min(4, c_out), c_out), nn.ReLU())


class ViewEncoder(nn.Module):
    """One camera's clip (batch, 1, frames, H, W) -> a feature vector (batch, feat)."""

    def __init__(self, width: int = 8, feat: int = 32):
        super().__init__()
        self.body = nn.Sequential(
            conv2plus1d(1, width), nn.MaxPool3d((1, 2, 2)),            # (B, w, T, H/2, W/2)
            conv2plus1d(width, 2 * width), nn.MaxPool3d((2, 2, 2)),    # (B, 2w, T/2, H/4, W/4)
            conv2plus1d(2 * width, 4 * width))
        # keep a coarse map (2 time steps x 4 x 4 places) rather than one global average: where the other
        # vehicles are relative to the ego car, and when, is what separates a conflict from a pass-by
        self.pool = nn.AdaptiveAvgPool3d((2, 4, 4))                     # (B, 4w, 2, 4, 4)
        self.proj = nn.Linear(4 * width * 2 * 4 * 4, feat)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.pool(self.body(x)).flatten(1))           # (B, feat)


class FusionHead(nn.Module):
    """Concatenated view features (batch, views * feat) -> class logits (batch, n_classes)."""

    def __init__(self, n_views: int = 3, feat: int = 32, hidden: int = 64, n_classes: int = 3):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(n_views * feat, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.mlp(feats)


class MultiViewNet(nn.Module):
    """``video`` (batch, views, frames, H, W) -> logits (batch, n_classes)."""

    def __init__(self, n_views: int = 3, width: int = 8, feat: int = 32, hidden: int = 64, n_classes: int = 3):
        super().__init__()
        self.encoders = nn.ModuleList(ViewEncoder(width, feat) for _ in range(n_views))
        self.head = FusionHead(n_views, feat, hidden, n_classes)

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        feats = [enc(video[:, v:v + 1]) for v, enc in enumerate(self.encoders)]   # views x (B, feat)
        return self.head(torch.cat(feats, dim=1))
