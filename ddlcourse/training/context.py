"""One rank's view of a run: the ``dp x mp`` grid of its ranks (a :class:`ddlcourse.grid.Grid`), its device, clock,
reductions, data shares, seeds, checkpoints and result file. :func:`setup` makes it, on every rank.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ddlcourse import dist, sharding
from ddlcourse import grid as grids
from ddlcourse.device import now as device_now, synchronize as device_synchronize
from ddlcourse.parallel import data_parallel
from ddlcourse.training.checkpoint import RunCheckpointer
from ddlcourse.training.config import CaseConfig, ConfigError, check_backend
from ddlcourse.training.progress import Progress
from ddlcourse.training.results import results_dir, to_json, write_text_atomic


# --------------------------------------------------------------------------- process groups: one grid, built once
def grid(n: int, dp: int, mp: int) -> grids.Grid | None:
    """This rank's place in ``arange(n).view(dp, mp)`` over the first ``n`` ranks, with the torch groups along the
    axes made (collective over the world: every rank calls it, and :mod:`ddlcourse.grid` makes each line once per
    ``torch.distributed`` world); None on ranks outside the run. The ``mp`` lines are made only when ``mp > 1``.
    """
    g = grids.build(first=n, dp=dp, mp=mp)
    g.group("dp")
    if mp > 1:
        g.group("mp")
    return g if g.inside else None


# --------------------------------------------------------------------------- run context
class Timer:
    """``with ctx.timer() as t: ...`` -> ``t.seconds``; the device is synchronised at both ends."""

    def __init__(self, ctx: RunContext):
        self.ctx, self.seconds = ctx, 0.0

    def __enter__(self):
        self.start = self.ctx.now()
        return self

    def __exit__(self, *exc):
        self.seconds = self.ctx.now() - self.start
        return False


@dataclass
class RunContext:
    """One rank's view of a training run (``world_size`` may be smaller than the MPI world)."""

    rank: int
    world_size: int
    device: torch.device
    backend: str                 # ddp | horovod | allreduce
    comm: object                 # mpi4py communicator of the participating ranks
    group: object = None         # torch.distributed group (None = the whole world)
    progress_file: str | None = None
    grid: grids.Grid | None = None  # the run's dp x mp grid: coord("dp"), group("mp"), comm("dp"), ...
    cfg: CaseConfig | None = None
    _t0: float = field(default_factory=time.perf_counter)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def dp(self) -> int:
        """Replicas of the model: the grid's rows (the run's ranks without a grid)."""
        return self.grid.size("dp") if self.grid else self.world_size

    @property
    def mp(self) -> int:
        """Ranks that share one replica (1 without a grid)."""
        return self.grid.size("mp") if self.grid else 1

    def log(self, *msg) -> None:
        """Print on rank 0 only."""
        if self.is_root:
            print(*msg, flush=True)

    def progress(self, total: int, desc: str = "") -> Progress:
        return Progress(total, desc, enabled=self.is_root, progress_file=self.progress_file)

    def barrier(self) -> None:
        self.comm.Barrier()

    # ---- device
    def to(self, obj, non_blocking: bool = False):
        """``obj`` on this rank's device: a tensor or module, or tuples/lists/dicts of them (others unchanged)."""
        if torch.is_tensor(obj) or isinstance(obj, torch.nn.Module):
            return obj.to(self.device, non_blocking=non_blocking)
        if isinstance(obj, dict):
            return type(obj)((k, self.to(v, non_blocking)) for k, v in obj.items())
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):          # namedtuple
            return type(obj)(*(self.to(v, non_blocking) for v in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.to(v, non_blocking) for v in obj)
        return obj

    @staticmethod
    def numpy(t) -> np.ndarray:
        """A tensor (on any device) as a NumPy array: detached and copied to the CPU first."""
        return t.detach().cpu().numpy() if torch.is_tensor(t) else np.asarray(t)

    def synchronize(self) -> None:
        """Wait for the device's queued work (CUDA runs kernels asynchronously); no-op on the CPU."""
        device_synchronize(self.device)

    def now(self) -> float:
        """The course's one clock (:func:`ddlcourse.device.now`) on this rank's device: time spans measure the
        work, not its launch."""
        return device_now(self.device)

    def timer(self) -> Timer:
        return Timer(self)

    # ---- reductions over the run's ranks (metrics and logging; gradients go through wrap)
    def _reduce(self, x, op):
        from mpi4py import MPI      # lazy: optional and heavy (starts MPI); a context without ranks never reduces
        op = {"sum": MPI.SUM, "max": MPI.MAX}[op]
        if torch.is_tensor(x):
            x = self.numpy(x)
        if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
            return int(self.comm.allreduce(int(x), op=op))
        if np.ndim(x) == 0:
            return float(self.comm.allreduce(float(x), op=op))
        a = np.ascontiguousarray(x, dtype=np.float64)
        out = np.empty_like(a)
        self.comm.Allreduce(a, out, op=op)
        return out

    def sum(self, x):
        """Sum over the run's ranks of a number or NumPy array (or tensor, copied to the CPU)."""
        return self._reduce(x, "sum")

    def max(self, x):
        return self._reduce(x, "max")

    def mean(self, x):
        s = self._reduce(x, "sum")
        return s / self.world_size

    # ---- data, seeds, checkpoints, results
    def batches(self, n: int, global_batch: int, epoch: int, seed: int | None = None, shuffle: bool = True,
                drop_last: bool = False) -> list[np.ndarray]:
        """This replica's share of every global batch of ``epoch`` (:func:`ddlcourse.sharding.sharded_batches`).

        Shares go by data-parallel rank: the ``mp`` ranks of one replica get the same indices.
        """
        dp, dp_rank = (self.dp, self.grid.coord("dp")) if self.grid else (self.world_size, self.rank)
        seed = (self.cfg.seed if self.cfg is not None else 0) if seed is None else seed
        return sharding.sharded_batches(n, global_batch, dp_rank, dp, epoch, seed, shuffle, drop_last)

    def seed_epoch(self, epoch: int, seed: int | None = None) -> int:
        return seed_epoch((self.cfg.seed if self.cfg is not None else 0) if seed is None else seed, epoch, self.rank)

    def checkpointer(self, case: str, stage: str | None = None, epochs: int | None = None,
                     run_name: str | None = None, keep: int = 2) -> RunCheckpointer:
        """Checkpoints of this run (``results/<case>/ckpt/<run_name>[/<stage>]``); cleared if ``cfg.fresh``.

        With a model split over ``mp > 1`` ranks, every part is saved (in ``.../part<mp_rank>``) by the rank
        of the first replica that holds it; every rank of the run waits for the writes.
        """
        run_name = run_name or (self.cfg.run_name if self.cfg is not None else "default")
        folder = results_dir(case) / "ckpt" / run_name
        if stage:
            folder = folder / stage
        label = f"{case}/{stage}" if stage else case
        writer = None
        if self.mp > 1:
            part = self.grid.coord("mp")
            folder, label = folder / f"part{part}", f"{label}/part{part}"
            writer = self.grid.coord("dp") == 0
        ck = RunCheckpointer(folder, self, keep=keep, label=label, epochs=epochs, writer=writer)
        if self.cfg is not None and self.cfg.fresh:
            ck.clear()
        return ck

    def write_result(self, case: str, result: dict, name: str | None = None) -> Path | None:
        """Write ``results/<case>/result-<run_name>.json`` on rank 0 (tensors and arrays as lists); its path."""
        if not self.is_root:
            return None
        name = name or (self.cfg.run_name if self.cfg is not None else "default")
        return write_text_atomic(results_dir(case) / f"result-{name}.json", to_json(result))

    # ---- the model
    def wrap(self, model, optimizer, over: str = "dp", **kwargs):
        """Data-parallel model and optimizer for this run's backend.

        ``over="dp"``: the gradients are averaged over the data-parallel ranks (a column of the grid); the ``mp``
        ranks of a row hold different parts of the model (lab 4's views). ``over="run"``: over every rank of the
        run; each rank holds the whole model and the ``mp`` ranks split the data of one sample (lab 2's spatial
        slabs), so each contributes a part of every gradient."""
        if over not in ("dp", "run"):
            raise ValueError(f"over={over!r}: average over 'dp' (the data-parallel ranks) or 'run' (every rank)")
        wrong = {str(p.device) for p in model.parameters() if p.device != self.device}
        if wrong:
            raise RuntimeError(f"the model has parameters on {', '.join(sorted(wrong))} but this rank's device is "
                               f"{self.device}: build it with ctx.to(model) before making the optimizer")
        split = over == "dp" and self.mp > 1
        if (self.dp if split else self.world_size) == 1:
            return model, optimizer
        if split:
            check_split_model(self.backend, self.mp)
        group = self.grid.group("dp") if split else self.group
        return data_parallel.wrap(model, optimizer, backend=self.backend, group=group, **kwargs)


def check_split_model(backend: str, mp: int) -> None:
    """The rule for a model split over the ``mp`` ranks of each replica (lab 4's views): Horovod averages gradients
    over every rank, which would mix different parts of the model. A case calls it when its config is made (an
    error before any work); :meth:`RunContext.wrap` calls it too, for a case that did not."""
    if mp > 1 and backend == "horovod":
        raise ConfigError(f"Horovod averages gradients over all ranks, but this run's model is split over mp={mp} "
                          "ranks: use backend='ddp' (or allreduce), which average over the data-parallel ranks only")


def _mesh_shape(mesh, n: int) -> tuple[int, int]:
    dp, mp = mesh if mesh is not None else (n, 1)
    mp = int(mp)
    if mp < 1 or n % mp:
        raise ConfigError(f"mesh: mp={mp} must divide the number of ranks {n}")
    dp = n // mp if dp is None else int(dp)
    if dp * mp != n:
        raise ConfigError(f"mesh (dp={dp}, mp={mp}) has {dp * mp} places but the run has {n} ranks")
    return dp, mp


def setup(cfg: CaseConfig, mesh: tuple | None = None, *, progress_file: str | None = None) -> RunContext | None:
    """Initialise the run on this rank; ``None`` on ranks not taking part. Call it on every rank of the world.

    ``cfg``: the case's config (a :class:`CaseConfig`: its ``backend``, ``ranks`` and ``seed``). ``mesh=(dp,
    mp)`` lays the run's ranks out as a grid (``dp=None``: ``n // mp``); default ``(n, 1)``, plain data
    parallelism. The horovod backend always uses all ranks.
    """
    if not isinstance(cfg, CaseConfig):
        raise TypeError(f"training.setup takes the case's config (a training.CaseConfig, made with Config.make), "
                        f"not {type(cfg).__name__} {cfg!r}")
    backend, ranks, seed = cfg.backend, cfg.ranks, cfg.seed
    check_backend(backend)
    info = dist.init(horovod=(backend == "horovod"))
    n = info.world_size if ranks is None else int(ranks)
    if not 1 <= n <= info.world_size:
        raise ConfigError(f"ranks={n} but {info.world_size} MPI rank(s) are running")
    if backend == "horovod" and n != info.world_size:
        raise ConfigError(f"the horovod backend spans the whole world ({info.world_size} ranks); "
                          f"got ranks={n}. Use backend='ddp' to run on a subset of ranks")
    dp, mp = _mesh_shape(mesh, n)
    comm, group = dist.subgroup(n)                    # collective over the world, cached
    g = grid(n, dp, mp)                               # collective too, cached
    if comm is None:
        return None
    torch.manual_seed(dist.seed_for_rank(seed or 0, 0))   # the same initial model on every rank
    return RunContext(rank=info.rank, world_size=n, device=info.device, backend=backend, comm=comm,
                      group=None if n == info.world_size else group, progress_file=progress_file, grid=g, cfg=cfg)


def seed_epoch(seed: int, epoch: int, rank: int) -> int:
    """Seed for the random work of one epoch on one rank (data order, augmentation): resumable."""
    s = dist.seed_for_rank(seed + 7919 * epoch, rank)
    torch.manual_seed(s)
    return s
