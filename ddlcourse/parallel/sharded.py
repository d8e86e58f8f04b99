"""Sharded data parallelism: ZeRO stages 1 and 2 written out, and ZeRO-3 with torch's FSDP2 (``fully_shard``).

Plain data parallelism (DDP) keeps a full copy of everything on every rank. With Adam in fp32 that is
``4 + 4 + 8 = 16`` bytes per parameter: weights, gradients, two moments. ZeRO (Rajbhandari et al., 2020)
removes the redundancy over the ``N`` data-parallel ranks:

=========  ==========================  =========================================
stage      what is split over N        bytes per parameter per rank (fp32 Adam)
=========  ==========================  =========================================
DDP        nothing                     4 + 4 + 8           = 16
ZeRO-1     optimizer state             4 + 4 + 8/N
ZeRO-2     + gradients                 4 + (4 + 8)/N
ZeRO-3     + parameters (FSDP)         16/N   (+ one layer's full weights while it runs)
=========  ==========================  =========================================

:class:`ZeroDataParallel` gives every parameter an *owner* rank (greedy by size). Only the owner keeps Adam
state and steps the parameter, then broadcasts it. Stage 1 all-reduces every gradient; stage 2 *reduces* each
gradient to its owner as soon as backward produces it and the other ranks drop it. FSDP2 (``fully_shard``,
which runs on CPU with gloo in torch 2.13) shards the parameters as well and all-gathers each layer just in
time. :func:`state_bytes` measures what a rank holds (unique tensor storages; DTensors by their local shard).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn


MODES = ("ddp", "zero1", "zero2", "fsdp")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Bytes this rank holds in parameters, gradients and optimizer state (each storage counted once)."""
    seen: set = set()

    def nbytes(ts) -> int:
        total = 0
        for t in ts:
            if not isinstance(t, torch.Tensor):
                continue
            s = _local(t).untyped_storage()
            if s.data_ptr() not in seen and s.nbytes() > 0:
                seen.add(s.data_ptr())
                total += s.nbytes()
        return total

    params = list(model.parameters())
    out = dict(params=nbytes(params), grads=nbytes(p.grad for p in params if p.grad is not None))
    opt = 0
    if optimizer is not None:
        opt = nbytes(v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
    out["optimizer"] = opt
    out["total"] = out["params"] + out["grads"] + opt
    return out


def predicted_bytes_per_param(mode: str, world_size: int) -> float:
    """fp32 Adam: the table in the module docstring."""
    n = world_size
    return {"ddp": 16, "zero1": 8 + 8 / n, "zero2": 4 + 12 / n, "fsdp": 16 / n}[mode]


def assign_owners(params: list[torch.Tensor], world_size: int) -> list[int]:
    """Owner rank of each parameter: largest first, to the least-loaded rank (the same on every rank)."""
    load, owner = [0] * world_size, [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: (-params[i].numel(), i)):
        r = min(range(world_size), key=lambda k: (load[k], k))
        owner[i] = r
        load[r] += params[i].numel()
    return owner


class ZeroDataParallel:
    """ZeRO stage 1 or 2 around a model: ``loss.backward(); zdp.step(); zdp.zero_grad()``."""

    def __init__(self, model: nn.Module, optim_cls=torch.optim.Adam, stage: int = 1, group=None, **optim_kwargs):
        if stage not in (1, 2):
            raise ValueError(f"ZeroDataParallel implements stages 1 and 2, got {stage}; use fsdp for stage 3")
        self.model, self.stage, self.group = model, stage, group
        self.rank, self.world_size = tdist.get_rank(group), tdist.get_world_size(group)
        with torch.no_grad():             # every rank starts from the group's first rank's parameters
            src = tdist.get_global_rank(group, 0) if group is not None else 0
            for t in list(model.parameters()) + list(model.buffers()):
                tdist.broadcast(t.data, src, group=group)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.owner = assign_owners(self.params, self.world_size)
        owned = [p for p, o in zip(self.params, self.owner) if o == self.rank]
        # only the owner keeps optimizer state for a parameter
        self.optimizer = optim_cls(owned, **optim_kwargs) if owned else None
        self._hooks = []
        if stage == 2:
            for p, o in zip(self.params, self.owner):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._reduce_hook(o)))

    def _g(self, r: int) -> int:
        return tdist.get_global_rank(self.group, r) if self.group is not None else r

    def _reduce_hook(self, owner: int):
        def hook(p):
            tdist.reduce(p.grad, self._g(owner), op=tdist.ReduceOp.SUM, group=self.group)
            if owner == self.rank:
                p.grad.div_(self.world_size)
            else:
                p.grad = None            # stage 2: this rank does not keep gradients it does not own
        return hook

    def step(self) -> None:
        if self.stage == 1:
            for p in self.params:
                tdist.all_reduce(p.grad, group=self.group)
                p.grad.div_(self.world_size)
        if self.optimizer is not None:
            self.optimizer.step()
        with torch.no_grad():               # each owner sends its updated parameters to the others
            for p, o in zip(self.params, self.owner):
                tdist.broadcast(p.data, self._g(o), group=self.group)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def memory(self) -> dict:
        return state_bytes(self.model, self.optimizer)


# --------------------------------------------------------------------------- training and measurement
def make_model(dim: int = 32, hidden: int = 256, depth: int = 4, n_classes: int = 4, seed: int = 0) -> nn.Sequential:
    from ddlcourse.models.small import MLP
    torch.manual_seed(seed)
    return MLP(dim, n_classes, hidden=hidden, depth=depth)


def train(mode: str, steps: int = 3, global_batch: int = 32, dim: int = 32, hidden: int = 256, depth: int = 4,
          lr: float = 1e-3, group=None, seed: int = 0) -> dict:
    """Train ``steps`` Adam steps in ``mode`` (``serial`` on one process, or one of :data:`MODES` on every rank of
    ``group``); each rank takes its equal share of each global batch.

    Returns ``dict(losses, params (full, flattened), memory (this rank, after the last step, before zero_grad))``.
    """
    from ddlcourse.data.toy import teacher_classification

    serial = mode == "serial"
    if not serial and mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose 'serial' or one of {', '.join(MODES)}")
    r, n = (0, 1) if serial else (tdist.get_rank(group), tdist.get_world_size(group))
    if global_batch % n:
        raise ValueError(f"global_batch {global_batch} not divisible by {n} ranks")
    model = make_model(dim, hidden, depth, seed=seed)
    loss_fn = nn.CrossEntropyLoss()
    zdp = None
    if mode in ("serial", "ddp", "fsdp"):
        if mode == "ddp":
            model = nn.parallel.DistributedDataParallel(model, process_group=group)
        elif mode == "fsdp":
            from torch.distributed.fsdp import fully_shard
            from torch.distributed.device_mesh import DeviceMesh

            mesh = DeviceMesh.from_group(group or tdist.group.WORLD, "cpu")
            for layer in model:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        zdp = ZeroDataParallel(model, torch.optim.Adam, stage=int(mode[-1]), group=group, lr=lr)
        opt = zdp.optimizer
    losses, mem = [], None
    for step in range(steps):
        X, Y = teacher_classification(global_batch, dim=dim, n_classes=4, seed=seed + 100 + step)
        b = global_batch // n
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
        l = torch.tensor([loss.item()])
        if not serial:
            tdist.all_reduce(l, group=group)
            l /= n
        losses.append(l.item())
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in full])
    n_params = flat.numel()
    return dict(losses=losses, params=flat, memory=mem, n_params=n_params)


def compare_with_serial(mode: str, steps: int = 3, global_batch: int = 32, dim: int = 32, hidden: int = 64,
                        depth: int = 2, group=None) -> dict:
    """On every rank of ``group``: ``mode`` against serial training; returns max param/loss diffs and memory."""
    ser = train("serial", steps, global_batch, dim, hidden, depth)
    par = train(mode, steps, global_batch, dim, hidden, depth, group=group)
    return dict(param_diff=(ser["params"] - par["params"]).abs().max().item(),
                loss_diff=max(abs(a - b) for a, b in zip(ser["losses"], par["losses"])),
                memory=par["memory"], n_params=par["n_params"])
