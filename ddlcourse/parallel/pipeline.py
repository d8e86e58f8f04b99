"""Pipeline parallelism: GPipe and 1F1B schedules over stages, with micro-batches.

Rank ``s`` of ``group`` runs stage ``s`` (a module). The global batch is cut into ``m`` micro-batches that
flow through the stages one after another, so that stage ``s`` works on micro-batch ``i`` while stage
``s+1`` works on ``i-1``. What remains idle is the *bubble*: with ``p`` stages of equal cost,

    bubble fraction = (p - 1) / (m + p - 1)              (Huang et al., 2019, GPipe)

* ``gpipe``: all ``m`` forwards, then all ``m`` backwards. Every stage holds the activations of all ``m``
  micro-batches at the peak.
* ``1f1b``: after ``p - s - 1`` warm-up forwards, stage ``s`` alternates one forward and one backward
  (Narayanan et al., 2019, PipeDream; the non-interleaved schedule of Megatron-LM). Same bubble, but at
  most ``p - s`` micro-batches in flight: less activation memory.

The loss is the mean over micro-batches of ``loss_fn(out_i, y_i)``, so with equal micro-batches and a
mean-reduced ``loss_fn`` the gradients equal those of one serial step on the whole batch.

Written here on ``torch.distributed`` point-to-point (gloo on CPU) rather than with
``torch.distributed.pipelining``: that package does run on CPU with gloo (checked with torch 2.13;
:func:`torch_pipelining_step` uses it and the tests compare the two), but it records no per-step timestamps,
and the timelines and the measured bubble are the point of the lesson.

API, on every rank of ``group``::

    res = run(stage, micro_batches, targets, loss_fn, schedule="1f1b", group=group)
    res["loss"]      # mean loss over micro-batches, on every rank
    res["events"]    # this rank's timeline events (see model_parallel.Timeline); gather_events() for all
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn

from ddlcourse.device import rank_device
from ddlcourse.parallel.model_parallel import Sender, Timeline, _emulate, _global, recv_tensor

SCHEDULES = ("gpipe", "1f1b")


def predicted_bubble(num_stages: int, num_micro_batches: int) -> float:
    """(p - 1) / (m + p - 1)."""
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


def predicted_step_time(num_stages: int, num_micro_batches: int, delay_s: float, overhead_s: float = 0.0) -> float:
    """Makespan of one pipelined step with the emulated work of :func:`run` and free messages:
    ``(m + p - 1)`` forward slots and as many backward slots, a forward slot lasting ``delay_s / m + overhead_s``
    and a backward slot ``2 * delay_s / m + overhead_s``. It falls as ``1/m`` at first, then grows as ``m``."""
    m, p = num_micro_batches, num_stages
    return (m + p - 1) * (3 * delay_s / m + 2 * overhead_s)


def schedule_order(schedule: str, stage: int, num_stages: int, num_micro_batches: int) -> list[tuple[str, int]]:
    """The ordered list of ``("F", i)`` / ``("B", i)`` that stage ``stage`` executes."""
    m, p = num_micro_batches, num_stages
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if m < 1:
        raise ValueError(f"need at least one micro-batch, got {m}")
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(p - stage - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):                # steady state: one forward, one backward
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(m - warmup, m)]
    return order


def run(stage: nn.Module, micro_batches, targets, loss_fn, schedule: str = "1f1b", group=None,
        delay_s: float = 0.0, device=None, overhead_s: float = 0.0) -> dict:
    """One pipelined forward+backward over the micro-batches; gradients accumulate in ``stage``.

    ``stage``: this rank's module; rank ``s`` of ``group`` (default: the world) runs stage ``s``, so build the
    group from the ranks in stage order (e.g. ``torch.distributed.new_group([4, 5, 6, 7])``).
    ``micro_batches``: list of inputs (read on the first stage; elsewhere only its length counts, so
    ``[None] * m`` will do).
    ``targets``: list of targets (read on the last stage). ``device``: where ``stage`` lives (default: this
    rank's); activations and gradients arrive there.

    Emulated work (a ``time.sleep``, as if the stage ran on an accelerator; 0 = only the real compute):
    ``delay_s`` is this stage's forward over the *whole* global batch, shared among the micro-batches in
    proportion to their sizes, and ``overhead_s`` a fixed cost per micro-batch and step (kernel launches,
    message latency). A forward on ``n_i`` of ``N`` samples sleeps ``delay_s * n_i / N + overhead_s``, a
    backward ``2 * delay_s * n_i / N + overhead_s``. So more micro-batches shrink the bubble but add
    overhead: the trade-off in ``m`` is real (:func:`predicted_step_time`).
    Returns ``dict(loss, events, max_in_flight)``.
    """
    device = rank_device(device)
    s, p = tdist.get_rank(group), tdist.get_world_size(group)
    m = len(micro_batches)
    if s == p - 1 and len(targets) != m:
        raise ValueError(f"{len(targets)} targets for {m} micro-batches")
    if delay_s < 0 or overhead_s < 0:
        raise ValueError(f"emulated times must be >= 0, got delay_s={delay_s}, overhead_s={overhead_s}")
    share = [0.0] * m                                   # each micro-batch's share of the global batch
    if delay_s > 0:
        # Only stage 0 holds the inputs: it tells every stage the micro-batch sizes (one small broadcast).
        sizes = torch.zeros(m, dtype=torch.float64, device=device)
        if s == 0:
            sizes.copy_(torch.tensor([float(len(x)) for x in micro_batches], dtype=torch.float64, device=device))
        tdist.broadcast(sizes, _global(group, 0), group=group)
        share = (sizes / sizes.sum()).tolist()
    tl, snd = Timeline(s, device), Sender(group)
    saved, losses, max_in_flight = {}, [], 0
    for kind, i in schedule_order(schedule, s, p, m):
        if kind == "F":
            inp = micro_batches[i] if s == 0 else recv_tensor(s - 1, group, device=device).requires_grad_(True)

            def fwd():
                out = stage(inp)                              # (micro_batch, ...)
                _emulate(delay_s * share[i] + overhead_s)
                return loss_fn(out, targets[i]) / m if s == p - 1 else out

            out = tl.record("F", i, fwd)
            if s < p - 1:
                snd.send(out, s + 1)
            else:
                losses.append(out.detach())
            saved[i] = (inp, out)                             # activations kept until backward
            max_in_flight = max(max_in_flight, len(saved))
        else:
            inp, out = saved.pop(i)
            grad_out = None if s == p - 1 else recv_tensor(s + 1, group, device=device)

            def bwd():
                out.backward(grad_out)
                _emulate(2 * delay_s * share[i] + overhead_s)

            tl.record("B", i, bwd)
            if s > 0:
                snd.send(inp.grad, s - 1)
    snd.wait_all()
    loss = torch.zeros(1, device=device)
    if s == p - 1:
        loss.copy_(sum(losses).reshape(1))                     # stays on the device: no .item() before the broadcast
    tdist.broadcast(loss, _global(group, p - 1), group=group)
    return dict(loss=loss.item(), events=tl.events, max_in_flight=max_in_flight)


def torch_pipelining_step(stage: nn.Module, batch, target, loss_fn, num_micro_batches: int,
                          schedule: str = "gpipe", group=None, device=None):
    """The same step with ``torch.distributed.pipelining`` (for comparison). Returns the mean loss on the last
    stage, None elsewhere; gradients accumulate in ``stage``, which lives on ``device`` (default: this rank's)."""
    # lazy: torch.distributed.pipelining is heavy to import and only this comparison uses it
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    s, p = tdist.get_rank(group), tdist.get_world_size(group)
    pstage = PipelineStage(stage, s, p, rank_device(device), group=group)
    Sched = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    sched = Sched(pstage, n_microbatches=num_micro_batches, loss_fn=loss_fn)
    if s == 0:
        sched.step(batch)
        return None
    if s == p - 1:
        losses = []
        sched.step(target=target, losses=losses)
        return float(sum(losses)) / num_micro_batches
    sched.step()
    return None


# --------------------------------------------------------------------------- demo and check against serial

