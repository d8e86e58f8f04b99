"""Checkers of notebooks/18_tensor_spatial.ipynb (the halo exchange is also lab 2's): the reference answer of its
question, and the checker of the halo exchange the learner writes; the ZeRO and FSDP ones are in
checkers/sharded_data_parallel."""
import numpy as np

from ddlcourse import dist
from ddlcourse.exercises.solutions.tensor_spatial import HALO_VARIANTS
from ddlcourse.parallel import model_parallel as mp, spatial
from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose, exercise


@exercise("halo_rows", "a kernel of size k with dilation d reaches d*(k-1)/2 rows to each side")
def halo_rows(kernel: int, dilation: int) -> int:
    return dilation * (kernel - 1) // 2


# --------------------------------------------------------------------------- coding exercise: the halo exchange
_HALO_HINTS = {
    "wrong_edge": "you sent the wrong edge: the rank above needs your first rows, the rank below your last rows",
    "periodic": "at the top and bottom of the image the halo is zeros (the serial zero padding), not the rows "
                "of the rank at the other end",
    "one_row": "your halo is always one row: send and receive `halo` rows (a 5x5 convolution needs 2)",
    "swapped": "you put the rows from the rank below on top: the rows of rank - 1 go above your slab, "
               "those of rank + 1 below it",
}


@code_exercise("halo_exchange", distributed=True, ranks=(2, 3))
def check_halo_exchange(fn, **_) -> Verdict:
    """On every rank (rank r holds rows r*R .. (r+1)*R - 1 of an image, dim 2 of ``(N, C, H, W)``):
    ``fn(x, halo, rank, world, send, recv) -> tensor`` pads the local slab with ``halo`` rows of each neighbour
    (zeros at the image's top and bottom). ``send(t, dst)`` does not block; ``recv(src)`` returns what ``src``
    sent. Against ``spatial.halo_exchange`` (the forward), for halos of 1 and 2 rows."""
    import torch

    info = dist.init()
    r, p = dist.rank(), dist.world_size()
    g = torch.Generator().manual_seed(11)
    # float32, as a model's activations are: the exchange only moves values, so the comparison is exact, and
    # zeros made in float64 (numpy's default) or on the CPU show in the output's dtype or device
    image = torch.randn(2, 3, 4 * p, 5, generator=g)                           # (N, C, H, W), the same on all ranks
    x = image[:, :, 4 * r:4 * (r + 1)].contiguous().to(info.device)           # this rank's slab of rows
    kind = []                                                                 # what the learner's output was

    def run(f, learner=False):
        outs = []
        for halo in (1, 2):
            snd = mp.Sender()
            out = f(x.clone(), halo, r, p, lambda t, dst: snd.send(t, dst), lambda src: mp.recv_tensor(src, device=info.device))
            snd.wait_all()
            if learner and isinstance(out, torch.Tensor):
                kind.append((out.dtype, out.device))
            outs.append(np.asarray(torch.as_tensor(out).detach().cpu(), dtype=float).reshape(-1))
        return np.concatenate(outs)

    with torch.no_grad():
        ref = np.concatenate([np.asarray(spatial.halo_exchange(x, h, 2).cpu(), dtype=float).reshape(-1)
                              for h in (1, 2)])
    # every rank runs every variant (they communicate); with 2 ranks the wrap-around sends two messages to the
    # one neighbour, which arrive in order, so the periodic variant's result is deterministic there too
    mistakes = {h: run(HALO_VARIANTS[k]) for k, h in _HALO_HINTS.items()}      # (the dtype is checked below)
    v = diagnose(run(fn, learner=True), ref, mistakes, rtol=0, atol=0, what=f"rank {r}'s padded slab")
    odd = [(dt, dev) for dt, dev in kind if dt != x.dtype or dev != x.device]
    if v.ok and odd:
        dt, dev = odd[0]
        v = Verdict(False, f"the padded slab is {dt} on {dev}, but the slab came as {x.dtype} on {x.device}: make "
                           "the zeros of the image's edges like the slab (torch.zeros_like), not with numpy's or "
                           "torch's defaults, or the next layer gets a tensor of another dtype or device")
    return agreed(v)          # a mistake at the image's edges leaves the middle ranks right: say it on all
