"""Notebook 19 · ZeRO-1/2/3 and FSDP (:mod:`ddlcourse.parallel.sharded`) trained against serial."""
from __future__ import annotations

from collections import Counter
from contextlib import nullcontext

import torch
from torch import nn
import torch.distributed as tdist

from ddlcourse import grid
from ddlcourse.data.toy import teacher_classification
from ddlcourse.device import rank_device
from ddlcourse.models.small import MLP
from ddlcourse.parallel.sharded import MODES, ZeroDataParallel, count_ddp, counting_collectives, state_bytes


def make_model(dim: int = 32, hidden: int = 256, depth: int = 4, n_classes: int = 4, seed: int = 0,
               device=None) -> nn.Sequential:
    """The MLP of the experiments, initialised on the CPU (the same weights on any device), on ``device``
    (default: this rank's)."""
    torch.manual_seed(seed)
    return MLP(dim, n_classes, hidden=hidden, depth=depth).to(rank_device(device))


def train(mode: str, steps: int = 3, global_batch: int = 32, dim: int = 32, hidden: int = 256, depth: int = 4,
          lr: float = 1e-3, group=None, seed: int = 0, device=None, count_bytes: bool = False) -> dict:
    """Train ``steps`` Adam steps in ``mode`` (``serial`` on one process, or one of :data:`MODES` on every rank of
    ``group``); each rank takes its equal share of each global batch. Model and batches live on ``device``
    (default: this rank's).

    Returns ``dict(losses, params (full, flattened, on the CPU), memory (this rank, after the last step,
    before zero_grad))``. ``count_bytes``: also ``sent``, the bytes this rank sent per step in the forward, backward
    and update (mean over the steps after the first; set-up broadcasts and the loss report not counted), by kind.
    """
    serial = mode == "serial"
    if not serial and mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose 'serial' or one of {', '.join(MODES)}")
    r, n = (0, 1) if serial else (tdist.get_rank(group), tdist.get_world_size(group))
    if global_batch % n:
        raise ValueError(f"global_batch {global_batch} not divisible by {n} ranks")
    device = rank_device(device)
    model = make_model(dim, hidden, depth, seed=seed, device=device)
    loss_fn = nn.CrossEntropyLoss()
    zdp = None
    if mode in ("serial", "ddp", "fsdp"):
        if mode == "ddp":
            ids = [device.index] if device.type == "cuda" else None
            model = nn.parallel.DistributedDataParallel(model, device_ids=ids, process_group=group)
            if count_bytes:
                count_ddp(model, group)
        elif mode == "fsdp":
            from torch.distributed.fsdp import fully_shard

            mesh = grid.device_mesh_of(group, device.type)
            for layer in model:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        zdp = ZeroDataParallel(model, torch.optim.Adam, stage=int(mode[-1]), group=group, lr=lr)
        opt = zdp.optimizer
    losses, mem, sent = [], None, Counter()
    for step in range(steps):
        X, Y = teacher_classification(global_batch, dim=dim, n_classes=4, seed=seed + 100 + step)
        X, Y = X.to(device), Y.to(device)
        b = global_batch // n
        with counting_collectives(sent) if count_bytes and step > 0 and not serial else nullcontext():
            loss = loss_fn(model(X[r * b:(r + 1) * b]), Y[r * b:(r + 1) * b])   # this rank's shard
            loss.backward()
            if zdp is not None:
                zdp.step()
            else:
                opt.step()
        mem = state_bytes(model, opt)
        if zdp is not None:
            zdp.zero_grad()
        else:
            opt.zero_grad()
        l = loss.detach().reshape(1).clone()                 # on the device, float32 like the loss
        if not serial:
            tdist.all_reduce(l, group=group)
            l /= n
        losses.append(l.item())
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in full]).cpu()
    n_params = flat.numel()
    out = dict(losses=losses, params=flat, memory=mem, n_params=n_params)
    if count_bytes:
        out["sent"] = {k: v / max(1, steps - 1) for k, v in sent.items()}
    return out


def compare_with_serial(mode: str, steps: int = 3, global_batch: int = 32, dim: int = 32, hidden: int = 64,
                        depth: int = 2, group=None, device=None) -> dict:
    """On every rank of ``group``: ``mode`` against serial training (both on ``device``, default this rank's);
    returns max param/loss diffs and memory."""
    ser = train("serial", steps, global_batch, dim, hidden, depth, device=device)
    par = train(mode, steps, global_batch, dim, hidden, depth, group=group, device=device)
    return dict(param_diff=(ser["params"] - par["params"]).abs().max().item(),
                loss_diff=max(abs(a - b) for a, b in zip(ser["losses"], par["losses"])),
                memory=par["memory"], n_params=par["n_params"])
