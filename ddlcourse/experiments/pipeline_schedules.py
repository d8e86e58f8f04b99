"""Notebook 17 · torch's pipeline schedules against the unpipelined model, with each rank's busy time and saved activations."""
from __future__ import annotations

import copy
import statistics

import torch
from torch import nn
import torch.distributed as tdist
from torch.distributed import pipelining as pp

from ddlcourse import dist
from ddlcourse.device import now
from ddlcourse.memory import SavedTensors
from ddlcourse.parallel.pipeline_schedules import _spec, stage_indices


def build_model(num_stages: int, dim: int, layers_per_stage: int, seed: int = 0) -> nn.Sequential:
    """The whole model (same on every rank): ``num_stages`` blocks of ``layers_per_stage`` Linear+tanh layers."""
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(*[m for _ in range(layers_per_stage)
                                           for m in (nn.Linear(dim, dim), nn.Tanh())])
                           for _ in range(num_stages)])


class _ChunkClock:
    """Times the compute calls of one step without stopping the device between them.

    On CUDA each call gets a pair of ``torch.cuda.Event(enable_timing=True)`` recorded on the current stream
    around it, and a reference event at the step's start; the events are read after the step, once the one
    synchronize at its end has run (a ``torch.cuda.synchronize`` around every chunk would drain the queue the
    schedule keeps full, and time that instead). Elsewhere a mark is the host clock, ``device.now``.
    """

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.ref = None

    def _event(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def start_step(self) -> float:
        """The step's start: the device is idle (synchronised) here, so the reference event reads as ``t0``."""
        t0 = now(self.device)
        if self.cuda:
            self.ref = self._event()
        return t0

    def mark(self):
        """A point around a chunk: an event recorded on the stream (CUDA), else the clock."""
        return self._event() if self.cuda else now(self.device)

    def end_step(self) -> float:
        """The step's end: the one synchronize, after which the events can be read."""
        return now(self.device)

    def seconds(self, mark, t0: float) -> float:
        """A mark as a time on the host clock's scale (events: ``t0`` plus their time after the reference)."""
        if self.cuda:
            return t0 + self.ref.elapsed_time(mark) / 1e3
        return mark


def _instrument(stage, events: list, rank: int, clock: _ChunkClock) -> None:
    """Record an event ``{rank, kind, micro_batch, stage, start, stop}`` around each compute call of ``stage``
    (``start``/``stop`` are the clock's marks: read them with :func:`_resolve` after the step)."""
    fwd, bwd, wgt = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    def timed(kind, fn, mb, *a, **k):
        t = clock.mark()
        out = fn(mb, *a, **k)
        events.append(dict(rank=rank, kind=kind, micro_batch=mb, stage=stage.stage_index, start=t, stop=clock.mark()))
        return out

    stage.forward_one_chunk = lambda mb, *a, **k: timed("F", fwd, mb, *a, **k)
    stage.backward_one_chunk = lambda mb, *a, **k: timed("B", bwd, mb, *a, **k)
    stage.backward_weight_one_chunk = lambda mb, *a, **k: timed("W", wgt, mb, *a, **k)


def _resolve(events: list, clock: _ChunkClock, t0: float) -> list:
    """The step's events with ``start``/``stop`` in seconds from ``t0`` (after :meth:`_ChunkClock.end_step`)."""
    return [{**e, "start": clock.seconds(e["start"], t0) - t0, "stop": clock.seconds(e["stop"], t0) - t0}
            for e in events]


def _setup(schedule, num_micro_batches, micro_batch, dim, layers_per_rank, group, seed):
    """This rank's stage modules and schedule, the serial model, and one global batch (same on every rank)."""
    info = dist.init()
    cls, v, _ = _spec(schedule)
    if layers_per_rank < v or layers_per_rank % v:
        raise ValueError(f"{schedule} puts {v} stages on each rank: layers_per_rank must be a multiple of {v}, "
                         f"got {layers_per_rank}")
    layers_per_stage = layers_per_rank // v
    p, r = tdist.get_world_size(group), tdist.get_rank(group)
    n_stages = p * v
    full = build_model(n_stages, dim, layers_per_stage, seed).to(info.device)
    mine = stage_indices(schedule, r, p)
    modules = {s: copy.deepcopy(full[s]) for s in mine}
    stages = [pp.PipelineStage(modules[s], s, n_stages, info.device, group=group) for s in mine]
    sched = cls(stages if v > 1 else stages[0], n_microbatches=num_micro_batches, loss_fn=nn.functional.mse_loss)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(num_micro_batches * micro_batch, dim, generator=g).to(info.device)   # (global_batch, dim)
    y = torch.randn(num_micro_batches * micro_batch, dim, generator=g).to(info.device)
    return info, full, modules, stages, sched, x, y, mine, n_stages


def _step(sched, mine, n_stages, x, y):
    """One pipelined step; the per-micro-batch losses on the rank holding the last stage."""
    losses = []
    args = (x,) if 0 in mine else ()
    kw = dict(target=y, losses=losses) if n_stages - 1 in mine else {}
    sched.step(*args, **kw)
    return losses


def compare_with_serial(schedule: str, num_micro_batches: int, micro_batch: int, dim: int,
                        layers_per_rank: int = 2, group=None, seed: int = 0) -> dict:
    """One step of ``schedule`` against the unpipelined model on the whole batch (MSE loss, mean).

    The model has ``layers_per_rank * p`` layers whatever the schedule (``layers_per_rank / v`` per stage).

    Returns this rank's ``{rank, stages, grad_diff, loss_diff}``: the largest ``|grad - serial grad|`` over the
    parameters of its stages, ``|mean micro-batch loss - serial loss|`` (0.0 off the last stage's rank) and
    ``n_losses``, the micro-batch losses this rank saw (``m`` on the last stage's rank, else 0).
    """
    info, full, modules, stages, sched, x, y, mine, n_stages = _setup(
        schedule, num_micro_batches, micro_batch, dim, layers_per_rank, group, seed)
    losses = _step(sched, mine, n_stages, x, y)
    serial_loss = nn.functional.mse_loss(full(x), y)
    serial_loss.backward()
    grad_diff = max((pm.grad - ps.grad).abs().max().item()
                    for s in mine for pm, ps in zip(modules[s].parameters(), full[s].parameters()))
    loss_diff = abs(torch.stack(losses).mean().item() - serial_loss.item()) if losses else 0.0
    return dict(rank=tdist.get_rank(group), stages=mine, grad_diff=grad_diff, loss_diff=loss_diff,
                n_losses=len(losses), device=str(info.device))


def measure(schedule: str, num_micro_batches: int, micro_batch: int, dim: int, layers_per_rank: int = 2,
            repeats: int = 3, group=None, seed: int = 0) -> dict:
    """Busy time, step time and saved activations of ``schedule`` on this rank (after one warm-up step).

    Returns ``{rank, stages, busy, makespan, events, peak_bytes, unit_bytes, held}``: ``busy``/``makespan``
    are the medians over ``repeats`` steps of the summed compute time and the step time (after a barrier) of
    this rank; ``events`` the compute calls of the last step, ``{rank, kind, micro_batch, stage, start, stop}``
    with times from its start; ``held`` the peak of the bytes
    autograd kept divided by ``unit_bytes``, the bytes one micro-batch keeps on this rank's stages.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    info, full, modules, stages, sched, x, y, mine, n_stages = _setup(
        schedule, num_micro_batches, micro_batch, dim, layers_per_rank, group, seed)
    r = tdist.get_rank(group)
    _step(sched, mine, n_stages, x, y)                  # warm-up: shapes, buffers, first p2p
    events: list = []
    clock = _ChunkClock(info.device)
    for st in stages:
        _instrument(st, events, r, clock)
    busy, spans, last = [], [], []
    params = [q for mod in modules.values() for q in mod.parameters()]
    saved = SavedTensors(skip=params, track_live=True)
    for _ in range(repeats):
        events.clear()
        for mod in modules.values():
            mod.zero_grad(set_to_none=True)
        tdist.barrier(group=group)
        saved.reset()
        t0 = clock.start_step()
        with saved:
            _step(sched, mine, n_stages, x, y)
        spans.append(clock.end_step() - t0)
        last = _resolve(events, clock, t0)
        busy.append(sum(e["stop"] - e["start"] for e in last))
    peak = saved.peak
    # one micro-batch through this rank's stages (plus the loss where the last stage lives), kept alive
    unit = SavedTensors(skip=params, track_live=True)
    with unit:
        xs = x[:micro_batch]
        outs = [modules[s](xs.clone()) for s in mine]      # each stage gets its own input, as in the pipeline
        if n_stages - 1 in mine:
            outs.append(nn.functional.mse_loss(outs[-1], y[:micro_batch]))
        unit_bytes = unit.peak
    del outs
    return dict(rank=r, stages=mine, busy=statistics.median(busy), makespan=statistics.median(spans),
                events=last, peak_bytes=peak, unit_bytes=unit_bytes, held=peak / unit_bytes)


def bubble(results: list[dict]) -> float:
    """Measured idle fraction of one step: ``1 - sum_r busy_r / (p * max_r makespan_r)``."""
    span = max(d["makespan"] for d in results)
    return 1.0 - sum(d["busy"] for d in results) / (len(results) * span)
