"""Torch-native sharding and checkpoints: FSDP2 + DTensor tensor parallelism on a 2-D DeviceMesh, and DCP.

* :func:`train_2d`: a small MLP trained with tensor parallelism (``parallelize_module``: the first layer
  column-wise, the second row-wise) inside each ``tp`` group and FSDP2 (``fully_shard``) across the ``dp``
  groups of a 2-D DeviceMesh ``(dp, tp)`` (from :mod:`ddlcourse.grid`: ``init_device_mesh``'s layout, on the
  package's cached groups). It follows :func:`train_serial` run on the
  same device: equal to rounding over the first steps, then statistically (AdamW amplifies the rounding of sums
  taken in another order: after 100 steps single weights differ by ~lr, the loss curves and the weights' norm
  only a little).
* :func:`train_phase`: FSDP2 training that saves and loads with ``torch.distributed.checkpoint`` (DCP). Every
  rank writes only its own shards plus metadata that says which rows of which parameter each file holds; a job
  with another number of ranks loads the rows *it* needs (resharding). Saved on 2 ranks, loaded on 4: the loaded
  parameters are exactly the saved ones, and the training goes on as the saving run did without a stop.
* :func:`shard_range`: the rows of a dim-0 shard that rank ``r`` holds (``torch.chunk``'s rule, as FSDP2 uses).

Batches are a function of the step number, so a run that stops and resumes sees the same data as one that
does not.
"""
from __future__ import annotations

import math
import os

import torch
import torch.distributed as tdist
from torch import nn

from ddlcourse import dist, grid
from ddlcourse.device import rank_device

FIRST_STEPS = 5     # the steps over which a run is compared tightly with another (then statistically)


# --------------------------------------------------------------------------- model, data, serial reference
def make_model(dim: int = 16, hidden: int = 64, n_classes: int = 4, seed: int = 0, device=None) -> nn.Module:
    """``Linear(dim, hidden) -> ReLU -> Linear(hidden, n_classes)``, the same on every rank (seeded)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, n_classes)).to(rank_device(device))


def batch(step: int, global_batch: int = 32, dim: int = 16, n_classes: int = 4, seed: int = 0):
    """The global batch of step ``step`` (inputs, labels), a function of the step only."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + 7919 * step + 1)
    x = torch.randn(global_batch, dim, generator=g)
    w = torch.randn(dim, n_classes, generator=torch.Generator().manual_seed(seed + 12345))
    return x, (x @ w).argmax(1)


def _optimizer(model: nn.Module, lr: float):
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)


def train_serial(steps: int, dim: int = 16, hidden: int = 64, global_batch: int = 32, lr: float = 1e-2,
                 seed: int = 0, device=None, first_steps: int = FIRST_STEPS) -> dict:
    """The reference: one process, the whole batch, on ``device`` (default: this rank's, ``dist.init().device``:
    compare it with the ranks on the device they use). Returns ``dict(losses, params, params_first)``: the
    parameters (flattened, on the CPU) after the run and after its first ``first_steps`` steps."""
    device = rank_device(device)
    model = make_model(dim, hidden, seed=seed, device=device)
    opt = _optimizer(model, lr)
    losses, first = [], None
    for step in range(steps):
        x, y = batch(step, global_batch, dim, seed=seed)
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss))
        if step + 1 == min(first_steps, steps):
            first = _full_params(model)
    params = _full_params(model)
    return {"losses": losses, "params": params, "params_first": params if first is None else first}


def param_gap(params, reference) -> float:
    """Relative difference of two flattened parameter vectors, ``||params - reference|| / ||reference||``.

    Not the largest element: AdamW divides each gradient by its own running size, so an element whose
    gradient is near zero moves by up to ``lr`` on rounding alone, while the norm stays at rounding (~1e-7)."""
    return float((params - reference).norm() / reference.norm().clamp_min(1e-30))


def _full_params(model: nn.Module) -> torch.Tensor:
    """All parameters, gathered (DTensor ``full_tensor``), flattened, on the CPU."""
    import logging

    # gathering a (dp, tp)-sharded weight takes two all-gathers; torch logs a warning about it on every rank
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().flatten().cpu()
                      for p in model.parameters()])


def shard_range(n_rows: int, n_ranks: int, rank: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of a dim-0 shard held by ``rank`` of ``n_ranks`` (``torch.chunk``'s rule, FSDP2's).

    Every rank gets ``ceil(n_rows / n_ranks)`` rows, the last ones what is left, which may be nothing.
    """
    if n_rows < 0 or n_ranks < 1 or not 0 <= rank < n_ranks:
        raise ValueError(f"need n_rows >= 0, n_ranks >= 1 and 0 <= rank < n_ranks (got {n_rows}, {n_ranks}, {rank})")
    size = math.ceil(n_rows / n_ranks)
    start = min(rank * size, n_rows)
    return start, min(start + size, n_rows)


# --------------------------------------------------------------------------- FSDP2 + TP on a 2-D mesh
def mesh_2d(dp: int, group_size: int | None = None, device=None):
    """The 2-D DeviceMesh ``(dp, tp)`` over the first ``group_size`` ranks (default all), named ``("dp", "tp")``,
    on this rank's device type: ``init_device_mesh``'s layout, built by :mod:`ddlcourse.grid` (collective over the
    world; None on ranks outside it)."""
    n = tdist.get_world_size() if group_size is None else group_size
    if dp < 1 or n % dp:
        raise ValueError(f"dp={dp} must divide the {n} ranks")
    return grid.build(first=n, dp=dp, tp=n // dp).device_mesh(rank_device(device))


def train_2d(steps: int, dp: int, dim: int = 16, hidden: int = 64, global_batch: int = 32, lr: float = 1e-2,
             seed: int = 0, device=None, first_steps: int = FIRST_STEPS, serial: bool = False) -> dict:
    """Tensor parallelism in each ``tp`` group, FSDP2 across ``dp``: a 2-D mesh of all ranks.

    Each ``dp`` group takes its equal share of every global batch; the ranks of a ``tp`` group take the same
    share and split the layers (first column-wise, second row-wise: one all-reduce per forward). Returns
    ``dict(losses, params (full, flattened), params_first (after the first ``first_steps`` steps), local_shapes
    (this rank's pieces), mesh)``. With ``serial``, rank 0 also trains :func:`train_serial` on its own device
    (the reference, on the device the ranks use), returned as ``serial`` (``None`` on the other ranks).
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    device = rank_device(device)
    mesh = mesh_2d(dp, device=device)
    if global_batch % dp:
        raise ValueError(f"global_batch {global_batch} must divide evenly over dp={dp} groups")
    if hidden % mesh["tp"].size():
        raise ValueError(f"hidden {hidden} must divide evenly over tp={mesh['tp'].size()} ranks")
    model = make_model(dim, hidden, seed=seed, device=device)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = _optimizer(model, lr)
    d, per = mesh["dp"].get_local_rank(), global_batch // dp
    losses, first = [], None
    for step in range(steps):
        x, y = batch(step, global_batch, dim, seed=seed)
        x, y = x[d * per:(d + 1) * per].to(device), y[d * per:(d + 1) * per].to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mean = loss.detach().reshape(1).clone()
        tdist.all_reduce(mean)                      # every rank of a dp group holds the same loss
        losses.append(float(mean) / tdist.get_world_size())
        if step + 1 == min(first_steps, steps):
            first = _full_params(model)             # collective: every rank gathers at the same step
    params = _full_params(model)
    ref = None
    if serial and tdist.get_rank() == 0:
        ref = train_serial(steps, dim, hidden, global_batch, lr, seed, device=device, first_steps=first_steps)
    return {"losses": losses, "params": params, "params_first": params if first is None else first,
            "local_shapes": {k: tuple(v.to_local().shape) for k, v in model.named_parameters()},
            "mesh": (dp, mesh["tp"].size()), "serial": ref}


# --------------------------------------------------------------------------- DCP: save on N ranks, load on M
def train_phase(first: int, last: int, load_from: str | None = None, save_to: str | None = None,
                dim: int = 16, hidden: int = 64, global_batch: int = 32, lr: float = 1e-2, seed: int = 0,
                device=None, save_at: int | None = None) -> dict:
    """FSDP2 training of steps ``first .. last-1`` on all ranks; load from / save to a DCP checkpoint directory.

    ``load_from``: a checkpoint saved by any number of ranks (``first`` must be the step it was saved at);
    DCP reads, on each rank, the rows of its own shards. ``save_to``: every rank writes its shards
    (``__<rank>_0.distcp``) and rank 0 the metadata (``.metadata``), after step ``save_at`` (default ``last``;
    the training goes on to ``last``: the run a resumed one should continue). Returns ``dict(losses, params
    (full, flattened), params_loaded (right after the load), params_saved (at the save), local_rows (rows of the
    first weight this rank holds), files_written)``.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    device = rank_device(device)
    n = tdist.get_world_size()
    if global_batch % n:
        raise ValueError(f"global_batch {global_batch} must divide evenly over {n} ranks")
    if not 0 <= first <= last:
        raise ValueError(f"need 0 <= first <= last (got {first}, {last})")
    save_at = last if save_at is None else save_at
    if save_to is not None and not first <= save_at <= last:
        raise ValueError(f"save_at={save_at} must lie in [{first}, {last}]")
    mesh = grid.build(dp=n).device_mesh(device)          # 1-D: FSDP2 shards over every rank
    model = make_model(dim, hidden, seed=seed, device=device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = _optimizer(model, lr)
    if load_from is not None:
        msd, osd = get_state_dict(model, opt)              # sharded (DTensor) state dicts, optimizer state made
        state = {"model": msd, "optim": osd, "step": torch.tensor(-1)}
        dcp.load(state, checkpoint_id=load_from)           # in place, each rank its own rows
        if int(state["step"]) != first:
            raise ValueError(f"checkpoint {load_from} was saved after step {int(state['step'])}, not {first}")
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    loaded = _full_params(model) if load_from is not None else None
    r, per = tdist.get_rank(), global_batch // n
    out = {"params_saved": None, "files_written": None}

    def save(done):
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd, "step": torch.tensor(done)}, checkpoint_id=save_to)
        tdist.barrier()
        out["params_saved"] = _full_params(model)
        out["files_written"] = sorted(os.listdir(save_to)) if r == 0 else None

    if save_to is not None and save_at == first:
        save(first)
    losses = []
    for step in range(first, last):
        x, y = batch(step, global_batch, dim, seed=seed)
        x, y = x[r * per:(r + 1) * per].to(device), y[r * per:(r + 1) * per].to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mean = loss.detach().reshape(1).clone()
        tdist.all_reduce(mean)
        losses.append(float(mean) / n)
        if save_to is not None and step + 1 == save_at:
            save(step + 1)
    w = model[0].weight
    return dict(out, losses=losses, params=_full_params(model), params_loaded=loaded, rank=r, n_ranks=n,
                local_rows=tuple(w.to_local().shape)[0])


def train_2d_on_engine(*args, **kwargs) -> dict:
    """On an ipyparallel engine: initialise ``torch.distributed`` from MPI, then :func:`train_2d`."""
    dist.init()
    return train_2d(*args, **kwargs)


def train_phase_on_engine(*args, **kwargs) -> dict:
    """On an ipyparallel engine: initialise ``torch.distributed`` from MPI, then :func:`train_phase`."""
    dist.init()
    return train_phase(*args, **kwargs)


def continues_exactly(phase_losses: list[float], reference_losses: list[float], rtol: float = 1e-5) -> bool:
    """Every loss equal to the reference's up to float32 rounding: for a few steps only (a short test run);
    a longer float32 run drifts by more (compare it with :func:`ddlcourse.integrity.trajectories_agree`)."""
    return len(phase_losses) == len(reference_losses) and all(
        abs(a - b) <= rtol * max(1.0, abs(b)) for a, b in zip(phase_losses, reference_losses))


def plot_resume(serial: list[float], saved: list[float], resumed: list[float], n_save: int, n_load: int, ax=None):
    """Loss per step: the uninterrupted serial run, the run that saved on ``n_save`` ranks, its resumption."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.8))
    ax.plot(range(1, len(serial) + 1), serial, "-", color="grey", lw=3, alpha=0.5, label="serial, no stop")
    ax.plot(range(1, len(saved) + 1), saved, "o", ms=4, label=f"FSDP2 on {n_save} ranks, then DCP save")
    ax.plot(range(len(saved) + 1, len(saved) + len(resumed) + 1), resumed, "s", ms=4,
            label=f"DCP load on {n_load} ranks, continued")
    ax.axvline(len(saved) + 0.5, color="red", ls=":", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7)
    return ax
