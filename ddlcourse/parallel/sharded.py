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
state and steps the parameter, then broadcasts it. Stage 1 *reduces* every gradient to its owner after backward
(the other ranks keep their full, now stale, gradients: that is the memory stage 2 saves); stage 2 reduces each
gradient as soon as backward produces it and the other ranks drop it. FSDP2 (``fully_shard``,
which runs on CPU with gloo in torch 2.13) shards the parameters as well and all-gathers each layer just in
time. :func:`state_bytes` measures what a rank holds (unique tensor storages; DTensors by their local shard).
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

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
        if self.stage == 1:                 # each gradient summed on its owner (ZeRO's reduce-scatter, per tensor)
            for p, o in zip(self.params, self.owner):
                tdist.reduce(p.grad, self._g(o), op=tdist.ReduceOp.SUM, group=self.group)
                if o == self.rank:
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


# --------------------------------------------------------------------------- communication volume
# Bytes one rank sends for a collective over n ranks, per byte of the full tensor, with the ring (pipelined)
# algorithms: all-reduce = reduce-scatter + all-gather; reduce and broadcast move each byte once per hop.
_SEND_FACTOR = {"all_reduce": 2.0, "reduce": 1.0, "broadcast": 1.0, "all_gather": 1.0, "reduce_scatter": 1.0}
_COLLECTIVES = {"all_reduce": "all_reduce", "reduce": "reduce", "broadcast": "broadcast",
                "all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
                "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter"}


def _full_tensor(kind: str, args, kwargs) -> torch.Tensor:
    """The full-size tensor of a collective call: the output of an all-gather, the input of a reduce-scatter,
    the (only) tensor of the others."""
    if kind == "all_gather":
        names, pos = ("output_tensor", "output"), 0
    elif kind == "reduce_scatter":
        names, pos = ("input", "input_tensor"), 1
    else:
        names, pos = ("tensor",), 0
    for k in names:
        if k in kwargs:
            return kwargs[k]
    return args[pos]


@contextmanager
def counting_collectives(sent: Counter):
    """Inside the block, add to ``sent[kind]`` the bytes this rank sends in each collective it calls through
    ``torch.distributed`` (ZeroDataParallel's, FSDP2's all-gathers and reduce-scatters, and DDP's bucket
    all-reduces once :func:`count_ddp` is registered), by the ring cost of :data:`_SEND_FACTOR`:
    ``factor * (n - 1) / n * full tensor bytes``. The collectives still run: this only counts."""
    saved = {}

    def wrap(name, kind, fn):
        def counted(*args, **kwargs):
            group = kwargs.get("group")
            n = tdist.get_world_size(group)
            t = _full_tensor(kind, args, kwargs)
            if n > 1:
                sent[kind] += _SEND_FACTOR[kind] * (n - 1) / n * t.numel() * t.element_size()
            return fn(*args, **kwargs)
        return counted

    for name, kind in _COLLECTIVES.items():
        if hasattr(tdist, name):
            saved[name] = getattr(tdist, name)
            setattr(tdist, name, wrap(name, kind, saved[name]))
    try:
        yield sent
    finally:
        for name, fn in saved.items():
            setattr(tdist, name, fn)


def count_ddp(ddp_model: nn.Module, group=None) -> None:
    """Route DDP's bucket all-reduces through ``torch.distributed.all_reduce`` (PyTorch's default all-reduce
    comm hook, the same averaging), so that :func:`counting_collectives` sees them."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    ddp_model.register_comm_hook(group, default_hooks.allreduce_hook)


def predicted_comm_bytes(mode: str, n_params: int, world_size: int, bytes_per_param: int = 4) -> float:
    """Bytes one rank sends per step (fp32 gradients and parameters, ring algorithms; Rajbhandari et al., 2020):
    DDP all-reduces the gradients, ``2 (N-1)/N Psi``; ZeRO-1 and -2 reduce them to their owners and broadcast the
    updated parameters, also ``2 (N-1)/N Psi``; ZeRO-3 (FSDP) all-gathers the parameters in forward and again in
    backward and reduce-scatters the gradients, ``3 (N-1)/N Psi``: 1.5 times DDP."""
    factor = {"ddp": 2, "zero1": 2, "zero2": 2, "fsdp": 3}
    if mode not in factor:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(factor)}")
    return factor[mode] * (world_size - 1) / world_size * n_params * bytes_per_param


# --------------------------------------------------------------------------- training and measurement

