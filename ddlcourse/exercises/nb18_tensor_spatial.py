"""Exercises of notebooks/18_tensor_spatial.ipynb (the halo exchange is also lab 2's); the ZeRO and FSDP ones
are in nb19_sharded_data_parallel."""
import numpy as np

from ddlcourse import dist
from ddlcourse.parallel import model_parallel as mp, spatial
from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose, exercise


@exercise("halo_rows", "a kernel of size k with dilation d reaches d*(k-1)/2 rows to each side")
def halo_rows(kernel: int, dilation: int) -> int:
    return dilation * (kernel - 1) // 2


# --------------------------------------------------------------------------- coding exercise: the halo exchange
def halo_exchange(x, halo, rank, world, send, recv):
    """x: this rank's rows (N, C, R, ...) -> (N, C, R + 2*halo, ...), padded with the neighbours' rows."""
    import torch
    first = x[:, :, :halo]               # my first rows: the rank above needs them below its own
    last = x[:, :, -halo:]               # my last rows: the rank below needs them above its own
    if rank > 0:
        send(first, rank - 1)
    if rank < world - 1:
        send(last, rank + 1)
    zeros = torch.zeros_like(first)      # beyond the image: the serial convolution's zero padding
    above = zeros
    if rank > 0:
        above = recv(rank - 1)
    below = zeros
    if rank < world - 1:
        below = recv(rank + 1)
    return torch.cat([above, x, below], dim=2)


_HALO_HINTS = {
    "wrong_edge": "you sent the wrong edge: the rank above needs your first rows, the rank below your last rows",
    "periodic": "at the top and bottom of the image the halo is zeros (the serial zero padding), not the rows "
                "of the rank at the other end",
    "one_row": "your halo is always one row: send and receive `halo` rows (a 5x5 convolution needs 2)",
    "swapped": "you put the rows from the rank below on top: the rows of rank - 1 go above your slab, "
               "those of rank + 1 below it",
}


def _halo_variant(kind: str):
    """Typical wrong halo exchanges ``(x, halo, rank, world, send, recv)`` along dim 2 (none deadlocks)."""
    import torch

    def exchange(x, halo, rank, world, send, recv):
        if kind == "one_row":
            halo = 1
        first, last = x[:, :, :halo], x[:, :, -halo:]
        if kind == "wrong_edge":                      # each neighbour gets the far edge
            first, last = last, first
        periodic = kind == "periodic"
        up, down = rank - 1, rank + 1
        if periodic:
            up, down = up % world, down % world
        if periodic or rank > 0:
            send(first, up)
        if periodic or rank < world - 1:
            send(last, down)
        zeros = torch.zeros_like(x[:, :, :halo])
        above = recv(up) if (periodic or rank > 0) else zeros
        below = recv(down) if (periodic or rank < world - 1) else zeros
        if kind == "swapped":
            above, below = below, above
        return torch.cat([above, x, below], dim=2)
    return exchange


@code_exercise("halo_exchange", distributed=True, solution=halo_exchange, ranks=(2, 3),
               mistakes=[(_halo_variant(k), h) for k, h in _HALO_HINTS.items()])
def check_halo_exchange(fn, **_) -> Verdict:
    """On every rank (rank r holds rows r*R .. (r+1)*R - 1 of an image, dim 2 of ``(N, C, H, W)``):
    ``fn(x, halo, rank, world, send, recv) -> tensor`` pads the local slab with ``halo`` rows of each neighbour
    (zeros at the image's top and bottom). ``send(t, dst)`` does not block; ``recv(src)`` returns what ``src``
    sent. Against ``spatial.halo_exchange`` (the forward), for halos of 1 and 2 rows."""
    import torch

    info = dist.init(horovod=False)
    r, p = dist.rank(), dist.world_size()
    g = torch.Generator().manual_seed(11)
    image = torch.randn(2, 3, 4 * p, 5, generator=g, dtype=torch.float64)   # (N, C, H, W), the same on all ranks
    x = image[:, :, 4 * r:4 * (r + 1)].contiguous().to(info.device)           # this rank's slab of rows

    def run(f):
        outs = []
        for halo in (1, 2):
            snd = mp.Sender()
            out = f(x.clone(), halo, r, p, lambda t, dst: snd.send(t, dst), lambda src: mp.recv_tensor(src, device=info.device))
            snd.wait_all()
            outs.append(np.asarray(torch.as_tensor(out).detach().cpu(), dtype=float).reshape(-1))
        return np.concatenate(outs)

    with torch.no_grad():
        ref = np.concatenate([np.asarray(spatial.halo_exchange(x, h, 2).cpu(), dtype=float).reshape(-1)
                              for h in (1, 2)])
    # every rank runs every variant (they communicate); with 2 ranks the wrap-around sends two messages to the
    # one neighbour, which arrive in order, so the periodic variant's result is deterministic there too
    mistakes = {h: run(_halo_variant(k)) for k, h in _HALO_HINTS.items()}
    v = diagnose(run(fn), ref, mistakes, rtol=1e-12, atol=1e-12, what=f"rank {r}'s padded slab")
    return agreed(v)          # a mistake at the image's edges leaves the middle ranks right: say it on all
