"""Notebook 16 · GPipe and 1F1B (:mod:`ddlcourse.parallel.pipeline`) against serial, and the bubble measured."""
from __future__ import annotations

from torch import nn
import torch.distributed as tdist

from ddlcourse.data.toy import teacher_classification
from ddlcourse.device import rank_device
from ddlcourse.experiments.model_parallel import demo_model
from ddlcourse.parallel.model_parallel import gather_events, idle_fraction, stage_module
from ddlcourse.parallel.pipeline import predicted_bubble, predicted_step_time, run


def compare_with_serial(num_micro_batches: int = 4, micro_batch: int = 8, n_layers: int = 8,
                        schedule: str = "1f1b", delay_s: float = 0.0, group=None, seed: int = 0,
                        device=None, overhead_s: float = 0.0) -> dict:
    """Run on every rank of ``group``: a pipelined step against the serial step on the same global batch.

    Everything lives on ``device`` (default: this rank's). ``delay_s``, ``overhead_s``: emulated work, see :func:`run`.
    Returns ``dict(loss_diff, grad_diff, loss, events (all ranks), max_in_flight, bubble, predicted, makespan)``.
    """
    device = rank_device(device)
    m = num_micro_batches
    X, Y = teacher_classification(m * micro_batch, dim=16, n_classes=4, seed=seed)   # global batch
    X, Y = X.to(device), Y.to(device)
    loss_fn = nn.CrossEntropyLoss()
    serial = demo_model(seed, n_layers=n_layers, device=device)
    ser_loss = loss_fn(serial(X), Y)
    ser_loss.backward()
    s, p = tdist.get_rank(group), tdist.get_world_size(group)
    stage = stage_module(demo_model(seed, n_layers=n_layers, device=device), s, p)
    res = run(stage, list(X.chunk(m)), list(Y.chunk(m)), loss_fn, schedule, group, delay_s, device=device,
              overhead_s=overhead_s)
    gd = max((a.grad - b.grad).abs().max().item()
             for a, b in zip(stage.parameters(), stage_module(serial, s, p).parameters()))
    events = gather_events(res["events"], group)
    return dict(loss_diff=abs(res["loss"] - ser_loss.item()), grad_diff=gd, loss=res["loss"], events=events,
                max_in_flight=res["max_in_flight"], bubble=idle_fraction(events), predicted=predicted_bubble(p, m),
                makespan=max(e["stop"] for e in events) - min(e["start"] for e in events))


def bubble_sweep(micro_batch_counts, schedule: str = "gpipe", global_batch: int = 64, n_layers: int = 8,
                 delay_s: float = 0.0, repeats: int = 1, group=None, device=None, overhead_s: float = 0.0) -> list[dict]:
    """Measured and predicted bubble for each number of micro-batches (best of ``repeats``), on every rank.

    The global batch is fixed, so the emulated work (``delay_s``, ``overhead_s``, see :func:`run`) of a
    micro-batch shrinks as ``m`` grows; each row also has the measured ``makespan`` and the
    ``predicted_time`` of :func:`predicted_step_time`."""
    rows = []
    for m in micro_batch_counts:
        if global_batch % m:
            raise ValueError(f"global_batch {global_batch} is not divisible by {m} micro-batches")
        best = None
        for _ in range(repeats):
            tdist.barrier(group=group)
            r = compare_with_serial(m, global_batch // m, n_layers, schedule, delay_s, group, device=device,
                                    overhead_s=overhead_s)
            if best is None or r["bubble"] < best["bubble"]:
                best = r
        p = tdist.get_world_size(group)
        rows.append(dict(m=m, measured=best["bubble"], predicted=best["predicted"], events=best["events"],
                         grad_diff=best["grad_diff"], makespan=best["makespan"],
                         predicted_time=predicted_step_time(p, m, delay_s, overhead_s)))
    return rows
