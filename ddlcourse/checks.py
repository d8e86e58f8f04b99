"""Environment checks: does MPI, torch.distributed and Horovod each work, and do they agree?"""
from __future__ import annotations

import numpy as np


def rank_vector(rank: int, length: int) -> np.ndarray:
    """Rank r contributes [r+1, r+1, ...]: the sum over N ranks is N(N+1)/2 in every entry."""
    return np.full(length, rank + 1, dtype=np.float64)


def expected_sum(world_size: int, length: int) -> list[float]:
    return [world_size * (world_size + 1) / 2] * length


def allreduce_three_ways(length: int = 4) -> dict:
    """On every rank: sum ``rank_vector`` over all ranks with mpi4py, torch.distributed and Horovod."""
    import torch
    import torch.distributed as tdist
    from mpi4py import MPI

    from ddlcourse import dist

    info = dist.init()
    x = rank_vector(info.rank, length)

    out_mpi = np.empty_like(x)
    MPI.COMM_WORLD.Allreduce(x, out_mpi, op=MPI.SUM)

    t = torch.from_numpy(x.copy()).to(info.device)
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM)

    import horovod.torch as hvd
    h = hvd.allreduce(torch.from_numpy(x.copy()), op=hvd.Sum, name="setup_check")

    return {"rank": info.rank, "mpi4py": out_mpi.tolist(), "torch.distributed": t.cpu().tolist(),
            "horovod": h.tolist(), "backend": info.backend}


def agree(results: list[dict], world_size: int, length: int) -> bool:
    """All three methods, on every rank, equal the known sum."""
    want = expected_sum(world_size, length)
    return all(r[k] == want for r in results for k in ("mpi4py", "torch.distributed", "horovod"))
