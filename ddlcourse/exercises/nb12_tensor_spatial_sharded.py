"""Exercises of notebooks/12_tensor_spatial_sharded.ipynb."""
import numpy as np

from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("zero2_bytes_per_param", "parameters stay whole (4 bytes); gradients (4) and Adam state (8) are split over N")
def zero2_bytes_per_param(world_size: int) -> float:
    return 4 + 12 / world_size


@exercise("halo_rows", "a kernel of size k with dilation d reaches d*(k-1)/2 rows to each side")
def halo_rows(kernel: int, dilation: int) -> int:
    return dilation * (kernel - 1) // 2


# --------------------------------------------------------------------------- coding exercise: the halo exchange
def _halo_variant(kind: str):
    """Typical wrong halo exchanges ``(x, halo, rank, world, send, recv)`` along dim 2 (none deadlocks)."""
    import torch

    def exchange(x, halo, rank, world, send, recv):
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
        return torch.cat([above, x, below], dim=2)
    return exchange


@code_exercise("halo_exchange", distributed=True)
def check_halo_exchange(fn, **_) -> Verdict:
    """On every rank (rank r holds rows r*R .. (r+1)*R - 1 of an image, dim 2 of ``(N, C, H, W)``):
    ``fn(x, halo, rank, world, send, recv) -> tensor`` pads the local slab with ``halo`` rows of each neighbour
    (zeros at the image's top and bottom). ``send(t, dst)`` does not block; ``recv(src)`` returns what ``src``
    sent. Against ``spatial.halo_exchange`` (the forward), for halos of 1 and 2 rows."""
    import torch

    from ddlcourse import dist
    from ddlcourse.parallel import model_parallel as mp, spatial
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
    mistakes = {"you sent the wrong edge: the rank above needs your first rows, the rank below your last rows":
                run(_halo_variant("wrong_edge"))}
    if p >= 3:                                        # with 2 ranks the wrap-around would pair messages twice
        mistakes["at the top and bottom of the image the halo is zeros (the serial zero padding), not the rows "
                 "of the rank at the other end"] = run(_halo_variant("periodic"))
    return diagnose(run(fn), ref, mistakes, rtol=1e-12, atol=1e-12, what=f"rank {r}'s padded slab")
