"""The rank's device, and clocks that wait for it.

The course rule: every model and tensor that a rank uses lives on ``dist.init().device`` (the GPU of the
local rank, else the CPU), and a timer waits for the device before it reads the clock. The helpers that
notebooks run on the engines take a ``device`` argument that defaults to :func:`rank_device`, and time with
:func:`now` (or :func:`synchronize` before ``time.perf_counter()``)::

    from ddlcourse.device import now, rank_device
    device = rank_device()                     # dist.init().device on a rank
    model = MLP(16, 4).to(device)
    t0 = now(device)
    loss = model(x.to(device)).sum()
    seconds = now(device) - t0                 # the GPU kernels are finished when the clock is read

CUDA runs kernels asynchronously: without a synchronisation the clock measures how long it took to *queue*
the work, not to do it.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as tdist

from ddlcourse import dist
from ddlcourse.cluster import placement


def rank_device(device=None) -> torch.device:
    """``device`` when given; else this rank's device, ``dist.init().device``.

    On an MPI rank that has not started ``torch.distributed`` (a parameter server's worker, a search's trial
    on an engine of a load-balanced view) it is the GPU of the rank's own local rank, as ``dist.init`` would
    pick it, found without a collective call (a trial runs on one engine alone). Off the ranks (a notebook's
    own kernel) it is local rank 0's device. Neither changes the process's current CUDA device.
    """
    if device is not None:
        return torch.device(device)

    if tdist.is_available() and tdist.is_initialized():
        return torch.device(dist.init().device)
    if placement.on_mpi_rank():
        return torch.device(placement.pick_device(set_current=False, collective=False))
    return torch.device(placement.pick_device(0, set_current=False))


def synchronize(device) -> None:
    """Wait until the queued work of ``device`` is done (CUDA); nothing to wait for on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device=None) -> float:
    """``time.perf_counter()`` read after :func:`synchronize` of ``device`` (None: read it at once)."""
    if device is not None:
        synchronize(device)
    return time.perf_counter()
