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


# --------------------------------------------------------------------------- coding exercise: the ZeRO-1 step
def _zero1_variant(kind: str):
    """Typical wrong ZeRO-1 steps ``(params, owner, rank, world, optimizer)`` (every rank makes the same calls)."""
    import torch
    import torch.distributed as tdist

    def step(params, owner, rank, world, optimizer):
        for p, o in zip(params, owner):
            if kind == "all_step":                          # DDP: every rank gets the mean of every gradient
                tdist.all_reduce(p.grad)
                p.grad /= world
                continue
            if kind != "local":
                tdist.reduce(p.grad, o, op=tdist.ReduceOp.SUM)
            if o == rank:
                if kind not in ("sum", "local"):
                    p.grad /= world
            elif kind != "no_drop":
                p.grad = None                               # not mine: the optimizer skips it, keeps no state
        optimizer.step()
        if kind in ("all_step", "no_broadcast"):
            return
        with torch.no_grad():
            for p, o in zip(params, owner):
                tdist.broadcast(p, o)
    return step


def _zero1_mistakes() -> dict:
    """hint -> the wrong step that hint is about (the checker runs each on the ranks)."""
    return {"the gradient on its owner is the sum over the ranks: divide it by world (the mean, as serial "
            "training on the whole batch has)": _zero1_variant("sum"),
            "the parameters a rank does not own are stale: after its step each owner must broadcast its "
            "parameters to the other ranks": _zero1_variant("no_broadcast"),
            "every rank stepped every parameter, so every rank keeps optimizer state for all of them (DDP's "
            "memory, not ZeRO-1's): set the gradient of a parameter you do not own to None before "
            "optimizer.step(); the optimizer then skips it and never allocates its state": _zero1_variant("all_step"),
            "each owner stepped with its own rank's gradient only: first reduce (sum) every gradient to its "
            "owner, and divide it there by world": _zero1_variant("local")}


@code_exercise("zero1_step", distributed=True)
def check_zero1_step(fn, steps: int = 3, **_) -> Verdict:
    """On every rank, after ``loss.backward()`` on the rank's share of the batch: ``fn(params, owner, rank, world,
    optimizer)`` makes one ZeRO-1 step. ``owner[i]`` is the rank that owns ``params[i]`` (``sharded.assign_owners``);
    ``optimizer`` was built over all the parameters, as in DDP, and creates a parameter's state at its first step.
    After ``steps`` steps the parameters must equal serial training on the whole batch (SGD with momentum, which,
    unlike Adam, shows a summed gradient) and each rank must keep optimizer state only for the parameters it owns."""
    import torch
    import torch.distributed as tdist
    import torch.nn.functional as F
    from torch import nn

    from ddlcourse import dist
    from ddlcourse.parallel import sharded
    info = dist.init(horovod=False)
    r, n = tdist.get_rank(), tdist.get_world_size()
    g = torch.Generator().manual_seed(12)
    X = torch.randn(steps, 4 * n, 6, generator=g, dtype=torch.float64).to(info.device)   # (step, global batch, in)
    Y = torch.randn(steps, 4 * n, 2, generator=g, dtype=torch.float64).to(info.device)

    def build():
        m = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)).to(info.device, torch.float64)
        gen = torch.Generator().manual_seed(3)             # the same weights on every rank, whatever the global seed
        with torch.no_grad():
            for q in m.parameters():
                q.copy_(0.5 * torch.randn(q.shape, generator=gen, dtype=torch.float64))
        return m

    def make_optimizer(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    serial = build()
    opt = make_optimizer(serial.parameters())
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        F.mse_loss(serial(X[s]), Y[s]).backward()
        opt.step()
    params = list(serial.parameters())
    owner = sharded.assign_owners(params, n)
    ref = np.concatenate([np.asarray(q.detach().cpu(), dtype=float).reshape(-1) for q in params]
                         + [[float(o == r) for o in owner]])

    def run(f):
        m = build()
        ps = list(m.parameters())
        opt = make_optimizer(ps)
        for s in range(steps):
            for q in ps:
                q.grad = None
            F.mse_loss(m(X[s, 4 * r:4 * (r + 1)]), Y[s, 4 * r:4 * (r + 1)]).backward()   # this rank's share
            f(ps, list(owner), r, n, opt)
        has_state = [float(bool(opt.state.get(q))) for q in ps]
        return np.concatenate([np.asarray(q.detach().cpu(), dtype=float).reshape(-1) for q in ps] + [has_state])

    mistakes = {hint: run(f) for hint, f in _zero1_mistakes().items()}
    return diagnose(run(fn), ref, mistakes, rtol=1e-9, atol=1e-12,
                    what=f"rank {r}'s parameters and optimizer-state flags")
