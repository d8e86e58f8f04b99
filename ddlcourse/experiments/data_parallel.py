"""Notebooks 05, 06 and 12 · the data-parallel ways trained and timed against serial, and optimizer state across ranks."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
import torch.distributed as tdist

from ddlcourse import bench, dist, integrity
from ddlcourse.data.toy import teacher_classification
from ddlcourse.device import rank_device
from ddlcourse.models.small import MLP
from ddlcourse.optim import RECIPES, broadcast_state, make_optimizer, state_tensors
from ddlcourse.parallel.data_parallel import OverlappingHooks, average_gradients, broadcast_parameters, unwrap, wrap


WAYS = ("serial", "after_backward", "allreduce", "overlap", "ddp", "horovod")
FIRST_STEPS = 5      # the steps over which a run is compared tightly with the serial one (then statistically)


def train_way(way: str, steps: int = 5, global_batch: int = 32, n_train: int = 512, dim: int = 16,
              hidden: int = 32, optimizer: str = "sgd", lr: float = 0.1, seed: int = 0,
              compression: str = "none", n_ranks: int | None = None, device=None) -> dict | None:
    """Train the same MLP on the same global batches one of :data:`WAYS`; runs on every rank.

    ``serial``: each rank trains on the whole global batch alone (the reference). Every other way
    splits each global batch into equal per-rank shares. ``n_ranks`` limits the run to the first
    ranks (not for horovod, which spans the world). Returns ``{"params", "params_first", "losses"}`` on
    the ranks that took part (the parameters as flat NumPy arrays after the run and after its first
    :data:`FIRST_STEPS` steps, the losses of the global batch), None on the others.
    Model and batches live on ``device`` (default: the rank's, ``dist.init().device``).
    """
    if way not in WAYS:
        raise ValueError(f"unknown way {way!r}; choose one of {', '.join(WAYS)}")
    dist.init(horovod=(way == "horovod"))
    device = rank_device(device)
    group = None
    if n_ranks is not None and way != "serial":
        if way == "horovod" and n_ranks != dist.world_size():
            raise ValueError("the horovod way spans all ranks; leave n_ranks=None")
        comm, group = dist.subgroup(n_ranks)
        if comm is None:
            return None
    world = 1 if way == "serial" else tdist.get_world_size(group)
    r = 0 if way == "serial" else tdist.get_rank(group)
    if global_batch % world:
        raise ValueError(f"global_batch {global_batch} must be divisible by the {world} ranks")
    X, y = teacher_classification(n_train, dim=dim, n_classes=4, seed=seed)
    X, y = X.to(device), y.to(device)
    # Each rank initialises its own model differently on purpose: step 3 (broadcast) must fix that.
    # The serial reference uses rank 0's seed, the one the broadcast spreads.
    torch.manual_seed(dist.seed_for_rank(seed, 0 if way == "serial" else dist.rank()))
    model = MLP(dim, 4, hidden=hidden).to(device)
    opt = make_optimizer(optimizer, model.parameters(), lr)
    hooks = None
    if way in ("allreduce", "ddp", "horovod"):
        model, opt = wrap(model, opt, backend=way, group=group, compression=compression)
    elif way in ("after_backward", "overlap"):
        broadcast_parameters(model, group=group)
        hooks = OverlappingHooks(model, group) if way == "overlap" else None
    losses = torch.zeros(steps, dtype=torch.float64, device=device)     # this rank's loss of every step
    first = None
    for step in range(steps):
        start = (step * global_batch) % n_train
        idx = (torch.arange(global_batch, device=device) + start) % n_train   # this step's global batch
        mine = idx[r::world]                                   # this rank's equal share
        loss = nn.functional.cross_entropy(model(X[mine]), y[mine])
        opt.zero_grad()
        loss.backward()
        if way == "after_backward":
            average_gradients(model, group)
        if hooks is not None:
            hooks.wait()
        opt.step()
        losses[step] = loss.detach()
        if step + 1 == FIRST_STEPS:
            first = _flat_params(model)
    if world > 1:           # equal shares: the global batch's loss is the mean of the ranks' (one allreduce)
        tdist.all_reduce(losses, group=group)
    params = _flat_params(model)
    return {"params": params, "params_first": params if first is None else first,
            "losses": (losses / world).tolist()}


def _flat_params(model: nn.Module):
    """All parameters of ``model`` (unwrapped from DDP), flattened into one NumPy array."""
    return torch.cat([p.detach().flatten() for p in unwrap(model).parameters()]).cpu().numpy()


def agrees_with_serial(serial: dict, run: dict, atol: float = 1e-5) -> bool:
    """Does a float32 data-parallel ``run`` train as ``serial`` does (both as :func:`train_way` returns them)?

    Only rounding separates the two: the allreduce adds the ranks' gradients in another order than one process
    sums its batch. Training amplifies that difference: at the cluster profile's 200 steps at lr 0.2 on 8 ranks,
    the final parameters of two correct runs differ by 1e-3 or more. So the parameters after the first
    :data:`FIRST_STEPS` steps must agree within ``atol``, and the loss trajectories as
    :func:`ddlcourse.integrity.trajectories_agree` says: tightly over those steps, statistically over the run.
    """
    first_gap = float(np.abs(run["params_first"] - serial["params_first"]).max())
    return first_gap < atol and integrity.trajectories_agree(serial["losses"], run["losses"], atol=atol,
                                                             exact_steps=FIRST_STEPS)


def time_way(way: str, steps: int = 10, micro_batch: int = 64, dim: int = 64, hidden: int = 256,
             depth: int = 4, warmup: int = 2, device=None) -> dict:
    """Median seconds per training step of an MLP on random data, one of :data:`WAYS` (not serial);
    the slowest rank's time, with the device synchronised before each clock read. Runs on every rank."""
    if way == "serial" or way not in WAYS:
        raise ValueError(f"time_way needs a parallel way, one of {', '.join(WAYS[1:])}")
    dist.init(horovod=(way == "horovod"))
    device = rank_device(device)
    torch.manual_seed(0)
    model = MLP(dim, 10, hidden=hidden, depth=depth).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    hooks = None
    if way in ("allreduce", "ddp", "horovod"):
        model, opt = wrap(model, opt, backend=way)
    else:
        broadcast_parameters(model)
        hooks = OverlappingHooks(model) if way == "overlap" else None
    g = torch.Generator().manual_seed(dist.seed_for_rank(1, dist.rank()))
    x = torch.randn(micro_batch, dim, generator=g).to(device)        # drawn on the CPU: the same numbers on any device
    t = torch.randint(0, 10, (micro_batch,), generator=g).to(device)

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), t).backward()
        if way == "after_backward":
            average_gradients(model)
        if hooks is not None:
            hooks.wait()
        opt.step()

    st = bench.time_steps(step, n_steps=steps, warmup=warmup, samples_per_step=micro_batch * dist.world_size(),
                          sync=dist.barrier, device=device)
    if hooks is not None:
        hooks.remove()
    n_params = sum(p.numel() for p in unwrap(model).parameters())
    return {"way": way, "seconds": dist._comm().allreduce(st.median, op=_mpi_max()), "n_params": n_params,
            "samples_per_s": st.samples_per_step / st.median}


def _mpi_max():
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    return MPI.MAX


def state_consistency(name: str = "lamb", steps: int = 3, perturb: bool = False, fix: bool = False,
                      seed: int = 0, device=None) -> dict:
    """Data-parallel training (DDP) with optimizer ``name``: do the ranks' optimizer states and parameters agree?

    ``perturb``: after the first step, rank 1 scales its optimizer state (as if it had resumed from another
    checkpoint). ``fix``: then :func:`ddlcourse.optim.broadcast_state` from rank 0. Runs on every rank; returns
    the largest difference across ranks of the state tensors and of the parameters after ``steps`` steps. Model
    and data live on ``device`` (default: the rank's, ``dist.init().device``). Notebook 12 runs it; it lives
    here, beside :func:`wrap`, because it trains data-parallel (``optim`` stays free of the parallel wrappers).
    """
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    info = dist.init()
    device = rank_device(device)
    X, y = teacher_classification(256, dim=8, n_classes=4, seed=seed)
    X, y = X.to(device), y.to(device)
    torch.manual_seed(seed)
    model = MLP(8, 4, hidden=16).to(device)
    opt = make_optimizer(name, model.parameters(), lr=RECIPES[name][0])
    model, opt = wrap(model, opt, backend="ddp")
    for step in range(steps):
        idx = torch.arange(step * 32, step * 32 + 32, device=device)[info.rank::info.world_size]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X[idx]), y[idx]).backward()
        opt.step()
        if step == 0 and perturb:
            if info.rank == 1:
                with torch.no_grad():
                    for v in state_tensors(opt):
                        if v.is_floating_point() and v.numel() > 1:
                            v.mul_(3.0)
            if fix:
                broadcast_state(opt)
    comm = dist._comm()

    def spread(tensors):
        # mpi4py reduces host buffers (unless the MPI is CUDA-aware): copy to the CPU first
        flat = torch.cat([t.detach().float().flatten() for t in tensors]).cpu().numpy()
        lo, hi = flat.copy(), flat.copy()
        comm.Allreduce(MPI.IN_PLACE, lo, op=MPI.MIN)
        comm.Allreduce(MPI.IN_PLACE, hi, op=MPI.MAX)
        return float((hi - lo).max())

    state = [v for v in state_tensors(opt) if v.numel() > 1]
    return {"state_spread": spread(state), "param_spread": spread(list(unwrap(model).parameters()))}
