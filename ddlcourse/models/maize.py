"""Models of the maize lab: a small U-Net for instance segmentation, a small autoencoder for anomalies.

Instance segmentation *bottom-up* (in the spirit of Panoptic-DeepLab, Cheng et al. 2020): the U-Net
predicts, for every pixel,

* ``mask``   -- is it plant? (a logit),
* ``centre`` -- how close is it to a plant centre? (a logit of a Gaussian heatmap),
* ``offset`` -- the vector (dy, dx) from the pixel to the centre of its plant.

:func:`group_instances` turns these into instances: the peaks of the centre heatmap are the plants, and
each plant pixel joins the peak nearest to where its offset points.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

OFFSET_SCALE = 8.0  # the network predicts offsets / 8 so that its outputs stay of order one


def conv_block(c_in: int, c_out: int) -> nn.Sequential:
    """(conv 3x3 -> BatchNorm -> ReLU) twice; the BatchNorms are what SyncBatchNorm replaces."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
        nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """Encoder-decoder with skip connections (Ronneberger et al. 2015), ``depth`` halvings, 4 output maps."""

    def __init__(self, width: int = 16, depth: int = 2, in_ch: int = 3):
        super().__init__()
        chans = [width * 2 ** i for i in range(depth + 1)]              # e.g. 16, 32, 64
        self.down = nn.ModuleList([conv_block(in_ch, chans[0])] +
                                  [conv_block(chans[i], chans[i + 1]) for i in range(depth)])
        self.up = nn.ModuleList([nn.ConvTranspose2d(chans[i + 1], chans[i], 2, stride=2) for i in reversed(range(depth))])
        self.merge = nn.ModuleList([conv_block(2 * chans[i], chans[i]) for i in reversed(range(depth))])
        self.head = nn.Conv2d(chans[0], 4, 1)                            # mask, centre, offset dy, offset dx

    def forward(self, x: torch.Tensor) -> torch.Tensor:               # x: (batch, 3, H, W)
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool2d(x, 2))               # (batch, chans[i], H/2^i, W/2^i)
            skips.append(x)
        skips.pop()
        for up, merge in zip(self.up, self.merge):
            x = merge(torch.cat([up(x), skips.pop()], 1))                # back up one level
        return self.head(x)                                              # (batch, 4, H, W)


def seg_loss(out: torch.Tensor, tgt: torch.Tensor, w_centre: float = 2.0, w_offset: float = 0.5) -> torch.Tensor:
    """Mean over pixels of: BCE(mask) + w_centre * BCE(centre heatmap) + w_offset * L1(offset) on plant pixels.

    ``out`` (batch, 4, H, W) logits/offsets, ``tgt`` (batch, 4, H, W) from :func:`ddlcourse.data.maize.targets`.
    Every term is a mean over all pixels, so equal-sized micro-batches average to the global-batch loss.
    """
    fg = tgt[:, 0]
    l_mask = F.binary_cross_entropy_with_logits(out[:, 0], fg)
    l_centre = F.binary_cross_entropy_with_logits(out[:, 1], tgt[:, 1])
    l_off = ((out[:, 2:] - tgt[:, 2:] / OFFSET_SCALE).abs().sum(1) * fg).mean()
    return l_mask + w_centre * l_centre + w_offset * l_off


@torch.no_grad()
def group_instances(out: torch.Tensor, mask_thr: float = 0.5, centre_thr: float = 0.3, nms: int = 5,
                    min_area: int = 6, max_dist: float = 10.0):
    """Instances of one image from the U-Net output ``out`` (4, H, W).

    Returns ``(ids (H, W) int64 with 0 = background, scores (n,))``; instance k+1 has score ``scores[k]``
    (the height of its centre peak).
    """
    _, H, W = out.shape
    fg = torch.sigmoid(out[0]) > mask_thr
    heat = torch.sigmoid(out[1])[None, None]                             # (1, 1, H, W)
    peak = (heat == F.max_pool2d(heat, nms, stride=1, padding=nms // 2)) & (heat > centre_thr)
    py, px = torch.nonzero(peak[0, 0], as_tuple=True)
    ids = torch.zeros(H, W, dtype=torch.int64)
    if py.numel() == 0 or not fg.any():
        return ids, torch.zeros(0)
    yy, xx = torch.nonzero(fg, as_tuple=True)
    vy = yy + out[2, yy, xx] * OFFSET_SCALE                              # where each plant pixel votes
    vx = xx + out[3, yy, xx] * OFFSET_SCALE
    d2 = (vy[:, None] - py[None].float()) ** 2 + (vx[:, None] - px[None].float()) ** 2   # (pixels, peaks)
    best = d2.argmin(1)
    ok = d2.gather(1, best[:, None])[:, 0] <= max_dist ** 2
    ids[yy[ok], xx[ok]] = best[ok] + 1
    scores = heat[0, 0, py, px]
    # drop peaks that gathered (almost) no pixels, and renumber 1..n
    area = torch.bincount(ids.ravel(), minlength=len(py) + 1)[1:]
    keep = torch.nonzero(area >= min_area)[:, 0]
    remap = torch.zeros(len(py) + 1, dtype=torch.int64)
    remap[keep + 1] = torch.arange(1, len(keep) + 1)
    return remap[ids], scores[keep]


class CropAutoencoder(nn.Module):
    """A small convolutional autoencoder of (3, 32, 32) plant crops with a ``latent``-dimensional code."""

    def __init__(self, latent: int = 8, width: int = 16, size: int = 32):
        super().__init__()
        if size % 8:
            raise ValueError(f"crop size must be a multiple of 8, got {size}")
        s = size // 8
        self.s, self.width = s, width
        self.encoder = nn.Sequential(                                     # (batch, 3, 32, 32)
            nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU(),       # (batch, w, 16, 16)
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),   # (batch, 2w, 8, 8)
            nn.Conv2d(2 * width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),   # (batch, 2w, 4, 4)
            nn.Flatten(), nn.Linear(2 * width * s * s, latent))           # (batch, latent)
        self.decoder_in = nn.Linear(latent, 2 * width * s * s)
        self.decoder = nn.Sequential(
            nn.ReLU(),
            nn.ConvTranspose2d(2 * width, 2 * width, 4, stride=2, padding=1), nn.ReLU(),   # (batch, 2w, 8, 8)
            nn.ConvTranspose2d(2 * width, width, 4, stride=2, padding=1), nn.ReLU(),       # (batch, w, 16, 16)
            nn.ConvTranspose2d(width, 3, 4, stride=2, padding=1))                         # (batch, 3, 32, 32)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        h = self.decoder_in(z).view(-1, 2 * self.width, self.s, self.s)
        return torch.sigmoid(self.decoder(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))
