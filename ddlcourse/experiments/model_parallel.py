"""Notebook 15 · one naive model-parallel step (:mod:`ddlcourse.parallel.model_parallel`) against the serial step."""
from __future__ import annotations

import torch
from torch import nn
import torch.distributed as tdist

from ddlcourse.data.toy import teacher_classification
from ddlcourse.device import rank_device
from ddlcourse.parallel.model_parallel import gather_events, stage_module, train_step


def demo_model(seed: int = 0, dim: int = 16, hidden: int = 32, n_layers: int = 8, n_classes: int = 4,
               device=None) -> nn.Sequential:
    """A deep MLP as an ``nn.Sequential`` of (Linear, Tanh) blocks, the same on every rank for ``seed``;
    on ``device`` (default: this rank's). Initialised on the CPU, so the weights do not depend on the device."""
    torch.manual_seed(seed)
    layers, d = [], dim
    for _ in range(n_layers - 1):
        layers.append(nn.Sequential(nn.Linear(d, hidden), nn.Tanh()))
        d = hidden
    layers.append(nn.Linear(d, n_classes))
    return nn.Sequential(*layers).to(rank_device(device))


def compare_with_serial(batch: int = 32, n_layers: int = 8, delay_s: float = 0.0, group=None, seed: int = 0,
                        device=None) -> dict:
    """Run on every rank of ``group``: one model-parallel step against the serial step on the same batch.

    Everything lives on ``device`` (default: this rank's).
    Returns ``dict(loss_diff, grad_diff, loss, events)`` (grad_diff over this rank's stage).
    """
    device = rank_device(device)
    X, Y = teacher_classification(batch, dim=16, n_classes=4, seed=seed)
    X, Y = X.to(device), Y.to(device)
    serial = demo_model(seed, n_layers=n_layers, device=device)
    loss_fn = nn.CrossEntropyLoss()
    ser_loss = loss_fn(serial(X), Y)
    ser_loss.backward()
    r, p = tdist.get_rank(group), tdist.get_world_size(group)
    model = demo_model(seed, n_layers=n_layers, device=device)
    stage = stage_module(model, r, p)
    res = train_step(stage, X, Y, loss_fn, group, delay_s, device=device)
    ser_stage = stage_module(serial, r, p)
    gd = max((a.grad - b.grad).abs().max().item() for a, b in zip(stage.parameters(), ser_stage.parameters()))
    return dict(loss_diff=abs(res["loss"] - ser_loss.item()), grad_diff=gd, loss=res["loss"],
                events=gather_events(res["events"], group))
