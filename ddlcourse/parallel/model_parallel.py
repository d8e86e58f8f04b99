"""Naive model (layer) parallelism: consecutive layers on consecutive ranks, activations sent forward,
gradients sent backward with point-to-point messages.

Each rank of ``group`` owns one *stage* (a slice of an ``nn.Sequential``). One training step::

    rank 0: x -> stage0 -> send a1 ............................ recv g1 -> backward
    rank 1:            recv a1 -> stage1 -> send a2 ...... recv g2 -> backward -> send g1
    rank 2:                          recv a2 -> stage2 -> loss -> backward -> send g2

Only one rank computes at a time: the others wait (see the timeline that :func:`train_step` records).
The pipeline schedules of :mod:`ddlcourse.parallel.pipeline` fill that idle time with micro-batches.

Shared pieces used by the pipeline too: :func:`partition` (which layers go to which stage),
:func:`send_tensor`/:func:`recv_tensor` (a tensor of any shape: a small header, then the data) and
:class:`Timeline` (events with timestamps for the timeline plots of :mod:`ddlcourse.plots_timeline`).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as tdist
from torch import nn

from ddlcourse.device import now, rank_device

_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64]
_HEADER = 9          # dtype code, ndim, then up to 7 sizes


# --------------------------------------------------------------------------- partition the layers
def partition(n_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Split ``n_layers`` consecutive layers into ``num_stages`` contiguous ranges ``[start, stop)`` of equal size
    (the first ones get one more when it does not divide)."""
    if not 1 <= num_stages <= n_layers:
        raise ValueError(f"need 1 <= num_stages <= n_layers, got num_stages={num_stages}, n_layers={n_layers}")
    base, extra = divmod(n_layers, num_stages)
    bounds, start = [], 0
    for s in range(num_stages):
        stop = start + base + (s < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def stage_module(model: nn.Sequential, stage: int, num_stages: int, bounds=None) -> nn.Sequential:
    """The layers of ``model`` that stage ``stage`` owns (shares the parameters with ``model``)."""
    bounds = bounds or partition(len(model), num_stages)
    start, stop = bounds[stage]
    return nn.Sequential(*[model[i] for i in range(start, stop)])


# --------------------------------------------------------------------------- point-to-point of any shape
def _global(group, i: int) -> int:
    return tdist.get_global_rank(group, i) if group is not None else i


def send_tensor(t: torch.Tensor, dst: int, group=None, tag: int = 0) -> tuple:
    """Non-blocking send of ``t`` to group rank ``dst``; returns ``(requests, buffers)``: keep both until the requests are waited on."""
    if t.dim() > _HEADER - 2:
        raise ValueError(f"send_tensor handles up to {_HEADER - 2} dims, got {t.dim()}")
    # The header stays on the host whatever t's device (gloo carries it): the receiver reads its numbers
    # to allocate the buffer, and a header on a GPU would cost a device-to-host copy per message.
    header = torch.zeros(_HEADER, dtype=torch.int64)
    header[0], header[1] = _DTYPES.index(t.dtype), t.dim()
    header[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    t = t.detach().contiguous()
    g = _global(group, dst)
    return [tdist.isend(header, g, group=group, tag=tag), tdist.isend(t, g, group=group, tag=tag)], (header, t)


def recv_tensor(src: int, group=None, tag: int = 0, device=None) -> torch.Tensor:
    """Blocking receive of a tensor sent with :func:`send_tensor` from group rank ``src``, onto ``device``
    (default: this rank's)."""
    device = rank_device(device)
    header = torch.empty(_HEADER, dtype=torch.int64)     # on the host, as send_tensor sends it
    g = _global(group, src)
    tdist.recv(header, g, group=group, tag=tag)
    dtype, ndim = _DTYPES[int(header[0])], int(header[1])
    t = torch.empty([int(s) for s in header[2:2 + ndim]], dtype=dtype, device=device)
    tdist.recv(t, g, group=group, tag=tag)
    return t


class Sender:
    """Keeps non-blocking sends (and their buffers) alive until :meth:`wait_all`."""

    def __init__(self, group=None):
        self.group, self.pending = group, []

    def send(self, t: torch.Tensor, dst: int, tag: int = 0) -> None:
        reqs, bufs = send_tensor(t, dst, self.group, tag)
        self.pending.append((reqs, bufs))

    def wait_all(self) -> None:
        for reqs, _ in self.pending:
            for r in reqs:
                r.wait()
        self.pending = []


# --------------------------------------------------------------------------- timeline
class Timeline:
    """Events ``dict(rank, kind, micro_batch, start, stop)`` in seconds of ``time.perf_counter``.

    ``kind`` is ``"F"`` (forward), ``"B"`` (backward), or ``"wait"``. On one host all processes share the clock.
    The clock is read after synchronising ``device`` (on a GPU the kernels run asynchronously).
    """

    def __init__(self, rank: int, device=None):
        self.rank, self.events, self.device = rank, [], device

    def record(self, kind: str, micro_batch: int, fn, *args):
        t0 = now(self.device)
        out = fn(*args)
        self.events.append(dict(rank=self.rank, kind=kind, micro_batch=micro_batch, start=t0, stop=now(self.device)))
        return out


def busy_time(events: list[dict], rank: int) -> float:
    return sum(e["stop"] - e["start"] for e in events if e["rank"] == rank and e["kind"] in ("F", "B"))


def idle_fraction(events: list[dict]) -> float:
    """``1 - (total compute time) / (num_stages * makespan)``: the share of rank-time spent waiting."""
    ranks = sorted({e["rank"] for e in events})
    t0, t1 = min(e["start"] for e in events), max(e["stop"] for e in events)
    return 1.0 - sum(busy_time(events, r) for r in ranks) / (len(ranks) * (t1 - t0))


def gather_events(events: list[dict], group=None) -> list[dict]:
    """All ranks' events on every rank, times shifted so that the earliest event starts at 0."""
    parts = [None] * tdist.get_world_size(group)
    tdist.all_gather_object(parts, events, group=group)
    allev = [e for p in parts for e in p]
    t0 = min(e["start"] for e in allev) if allev else 0.0
    return [dict(e, start=e["start"] - t0, stop=e["stop"] - t0) for e in allev]


def _emulate(delay_s: float):
    """Pretend a stage takes ``delay_s`` longer (an accelerator-bound stage; makes timelines readable on a busy CPU)."""
    if delay_s > 0:
        time.sleep(delay_s)


# --------------------------------------------------------------------------- one naive model-parallel step
def train_step(stage: nn.Module, x, y, loss_fn, group=None, delay_s: float = 0.0, device=None) -> dict:
    """Forward and backward of one batch through the stages (rank ``i`` of ``group`` runs stage ``i``).

    ``x`` is used on the first stage only, ``y`` and ``loss_fn`` on the last. Parameter gradients are left in
    ``stage``'s parameters (step your optimizer after). ``delay_s`` adds emulated compute per forward
    (twice that per backward). ``device``: where ``stage`` lives (default: this rank's device); activations
    arrive there. Returns ``dict(loss, events)``: the loss on every rank, this rank's events.
    """
    device = rank_device(device)
    r, p = tdist.get_rank(group), tdist.get_world_size(group)
    tl, snd = Timeline(r, device), Sender(group)
    inp = x if r == 0 else recv_tensor(r - 1, group, device=device).requires_grad_(True)

    def fwd():
        out = stage(inp)
        _emulate(delay_s)
        return loss_fn(out, y) if r == p - 1 else out

    out = tl.record("F", 0, fwd)
    if r < p - 1:
        snd.send(out, r + 1)
        grad_out = recv_tensor(r + 1, group, device=device)

    def bwd():
        if r == p - 1:
            out.backward()
        else:
            out.backward(grad_out)
        _emulate(2 * delay_s)

    tl.record("B", 0, bwd)
    if r > 0:
        snd.send(inp.grad, r - 1)
    snd.wait_all()
    loss = torch.zeros(1, device=device)
    if r == p - 1:
        loss.copy_(out.detach().reshape(1))                  # stays on the device: no .item() before the broadcast
    tdist.broadcast(loss, _global(group, p - 1), group=group)
    return dict(loss=loss.item(), events=tl.events)


# --------------------------------------------------------------------------- check against serial


# --------------------------------------------------------------------------- run on the engines of a notebook
