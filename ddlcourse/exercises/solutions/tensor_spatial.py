"""Reference solutions of notebooks/18_tensor_spatial.ipynb (the halo exchange is also lab 2's): the halo exchange
as a learner writes it, and with one typical mistake each (what its checker,
:mod:`ddlcourse.exercises.checkers.tensor_spatial`, must name)."""
from ddlcourse.selfcheck import reference


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
        if kind == "float64_zeros":                   # numpy's habit: the edges' zeros in double precision
            zeros = torch.zeros(zeros.shape, dtype=torch.float64, device=x.device)
        above = recv(up) if (periodic or rank > 0) else zeros
        below = recv(down) if (periodic or rank < world - 1) else zeros
        if kind == "swapped":
            above, below = below, above
        return torch.cat([above, x, below], dim=2)
    return exchange


HALO_VARIANTS = {kind: _halo_variant(kind)
                 for kind in ("wrong_edge", "periodic", "one_row", "swapped", "float64_zeros")}

# the hint fragments are the checker's whole _HALO_HINTS, and its check of the output's dtype
reference("halo_exchange", mistakes=[
    (HALO_VARIANTS["wrong_edge"], "you sent the wrong edge: the rank above needs your first rows, the rank below "
                                  "your last rows"),
    (HALO_VARIANTS["periodic"], "at the top and bottom of the image the halo is zeros (the serial zero padding), "
                                "not the rows of the rank at the other end"),
    (HALO_VARIANTS["one_row"], "your halo is always one row: send and receive `halo` rows (a 5x5 convolution "
                               "needs 2)"),
    (HALO_VARIANTS["swapped"], "you put the rows from the rank below on top: the rows of rank - 1 go above your "
                               "slab, those of rank + 1 below it"),
    (HALO_VARIANTS["float64_zeros"], "make the zeros of the image's edges like the slab (torch.zeros_like)")])(halo_exchange)
