"""Models for seismic facies: one small U-Net (Ronneberger et al. 2015) in 2-D (sections) or 3-D (cubes).

    UNet(ndim=2)   input (batch, 1, depth, y)      -> logits (batch, n_classes, depth, y)     one inline section
    UNet(ndim=3)   input (batch, 1, depth, x, y)   -> logits (batch, n_classes, depth, x, y)  one cube

Each level is two 3x3(x3) convolutions with ReLU; going down is a max-pool by 2, going up a transposed
convolution with kernel 2 and stride 2, and the skip connection concatenates the encoder's features. No
batch normalisation: the 3-D model is trained with batches of one or two cubes, split across ranks.

**Spatial parallelism.** ``model.set_spatial(group)`` makes every 3x3x3 convolution a
:class:`ddlcourse.parallel.spatial.SpatialConv3d` that splits the *depth* axis across the ranks of
``group``: each rank holds a slab of the cube and fetches one depth slice of each neighbour (the halo)
before each convolution. Pooling by 2 and the transposed convolution are local when each slab's depth is
divisible by ``2**levels``; the 1x1 head is local. The weights are the same module: a state dict saved from a
spatial model loads into a plain one.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ddlcourse.memory import SavedTensors
from ddlcourse.parallel.spatial import SpatialConv2d, SpatialConv3d


class ConvReLU(nn.Module):
    """3x3 (2-D) or 3x3x3 (3-D) 'same' convolution and ReLU; optionally split along depth across ranks."""

    def __init__(self, ndim: int, c_in: int, c_out: int):
        super().__init__()
        self.conv = (nn.Conv2d if ndim == 2 else nn.Conv3d)(c_in, c_out, 3, padding=1)
        self._spatial = ()               # a tuple, so the wrapper is not a second registered copy of conv

    def set_spatial(self, group, exchange=None) -> None:
        wrap = SpatialConv2d if isinstance(self.conv, nn.Conv2d) else SpatialConv3d
        self._spatial = () if group is None else (wrap(self.conv, dim=2, group=group, exchange=exchange),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self._spatial[0] if self._spatial else self.conv    # same weights either way
        return torch.relu(conv(x))


class UNet(nn.Module):
    """A U-Net with ``levels`` poolings; ``width`` channels at the top, doubling at each level."""

    def __init__(self, ndim: int = 3, in_ch: int = 1, n_classes: int = 6, width: int = 8, levels: int = 2):
        super().__init__()
        if ndim not in (2, 3):
            raise ValueError(f"ndim must be 2 (sections) or 3 (cubes), got {ndim}")
        if levels < 1 or width < 1:
            raise ValueError(f"levels and width must be >= 1, got {levels}, {width}")
        self.ndim, self.levels, self.n_classes = ndim, levels, n_classes
        Pool = nn.MaxPool2d if ndim == 2 else nn.MaxPool3d
        Up = nn.ConvTranspose2d if ndim == 2 else nn.ConvTranspose3d
        Head = nn.Conv2d if ndim == 2 else nn.Conv3d
        ch = [width * 2 ** i for i in range(levels + 1)]        # e.g. 8, 16, 32

        def block(ci, co):
            return nn.Sequential(ConvReLU(ndim, ci, co), ConvReLU(ndim, co, co))

        self.down = nn.ModuleList([block(in_ch, ch[0])] + [block(ch[i], ch[i + 1]) for i in range(levels)])
        self.pool = Pool(2)
        self.up = nn.ModuleList([Up(ch[i + 1], ch[i], 2, stride=2) for i in reversed(range(levels))])
        self.dec = nn.ModuleList([block(2 * ch[i], ch[i]) for i in reversed(range(levels))])
        self.head = Head(ch[0], n_classes, 1)

    def set_spatial(self, group, exchange=None) -> "UNet":
        """Split the depth axis across the ranks of ``group`` (``None``: back to one rank). ``exchange``: a halo
        exchange ``(x, halo, rank, world, send, recv)`` to use (see ``spatial.halo_exchange``), e.g. a learner's."""
        for m in self.modules():
            if isinstance(m, ConvReLU):
                m.set_spatial(group, exchange)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:     # x: (batch, in_ch, depth, ...)
        f = 2 ** self.levels
        if any(s % f for s in x.shape[2:]):
            raise ValueError(f"every spatial size (per rank) must be divisible by 2**levels = {f}, got "
                             f"{tuple(x.shape[2:])}")
        skips = []
        for i, blk in enumerate(self.down):
            x = blk(x if i == 0 else self.pool(x))           # size halves at each level
            skips.append(x)
        skips.pop()                                          # the bottom has no skip
        for up, dec in zip(self.up, self.dec):
            x = dec(torch.cat([up(x), skips.pop()], dim=1))  # size doubles, channels: skip + up
        return self.head(x)                                  # (batch, n_classes, depth, ...)


def section_model(width: int = 8, levels: int = 2, n_classes: int = 6) -> UNet:
    """The 2-D model: classifies one inline section at a time."""
    return UNet(ndim=2, width=width, levels=levels, n_classes=n_classes)


def cube_model(width: int = 8, levels: int = 2, n_classes: int = 6) -> UNet:
    """The 3-D model: classifies a whole cube."""
    return UNet(ndim=3, width=width, levels=levels, n_classes=n_classes)


def n_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------- activation memory
class ZeroHaloConv(nn.Module):
    """What one rank of a spatial split computes and saves, with zeros for the neighbours' halo slices.

    Used to *predict* the memory of a slab: the same tensors as :class:`SpatialConv3d`, no communication.
    """

    def __init__(self, conv: nn.Module):
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x.new_zeros(x.shape[:2] + (1,) + x.shape[3:])
        xh = torch.cat([z, x, z], dim=2)                    # depth + 2: a new tensor, saved by the conv
        c = self.conv
        fn = nn.functional.conv3d if xh.dim() == 5 else nn.functional.conv2d
        return fn(xh, c.weight, c.bias, 1, (0,) + tuple(c.padding[1:]))


def activation_bytes(model: nn.Module, input_shape, device: str = "meta", loss: bool = True,
                     halo: bool = False) -> int:
    """Bytes of the tensors that autograd saves for backward in one forward (+ loss) pass.

    These saved activations, not the weights, are what grows with the cube. Counted with
    :class:`ddlcourse.memory.SavedTensors`; each storage once (a tensor saved twice costs once).
    On ``device="meta"`` nothing is computed, so a 512^3 cube is measured in milliseconds. Parameters
    saved for backward are left out (they are memory of the model, not of the activations).
    """
    m = copy.deepcopy(model).to(device)          # a copy: measuring never touches the model's weights
    if halo:                                     # one slab of a spatial split: every conv pads with a halo
        for blk in m.modules():
            if isinstance(blk, ConvReLU):
                blk._spatial = (ZeroHaloConv(blk.conv),)

    x = torch.zeros(input_shape, device=device)
    with SavedTensors(skip=m.parameters()) as saved:
        out = m(x)
        if loss:
            target = torch.zeros((out.shape[0],) + tuple(out.shape[2:]), dtype=torch.long, device=device)
            torch.nn.functional.cross_entropy(out, target)
    return saved.bytes
