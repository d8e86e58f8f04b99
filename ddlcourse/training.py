"""What every case study's ``train(cfg)`` shares: the run context, checkpoints, progress, and running
on a cluster from a notebook.

Inside ``train(cfg)`` (on every rank, under ipyparallel or ``mpiexec``/``srun``)::

    ctx = training.setup(cfg.backend, ranks=cfg.ranks, seed=cfg.seed)   # None on ranks left out
    ...
    ckpt = training.Checkpointer(training.results_dir("seismic") / "ckpt" / cfg.run_name, ctx)
    start_epoch, state = ckpt.load(model, optimizer)                  # resumes where it stopped
    bar = ctx.progress(total_steps, desc="seismic")
    for epoch in range(start_epoch, cfg.epochs):
        training.seed_epoch(cfg.seed, epoch, ctx.rank)                 # exact resume: seeds depend on epoch
        ...; bar.update(loss=loss.item())
        ckpt.save(epoch + 1, model, optimizer, history=history)
    bar.close()

From a notebook::

    results = training.run(c, seismic.train, cfg, desc="seismic")    # live progress bar, results per rank
"""
from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch


# --------------------------------------------------------------------------- where results go
def repo_root() -> Path | None:
    """The course checkout (the folder with pyproject.toml above this package), if any."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").exists() else None


def results_dir(case: str) -> Path:
    """``results/<case>/`` in the checkout (ignored by git), or under ``$DDLCOURSE_RESULTS``."""
    base = os.environ.get("DDLCOURSE_RESULTS")
    root = Path(base) if base else (repo_root() or Path.cwd()) / "results"
    d = root / case
    d.mkdir(parents=True, exist_ok=True)
    return d


# --------------------------------------------------------------------------- run context
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
    _t0: float = field(default_factory=time.perf_counter)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def progress(self, total: int, desc: str = "") -> "Progress":
        return Progress(total, desc, enabled=self.is_root, progress_file=self.progress_file)

    def barrier(self) -> None:
        self.comm.Barrier()

    def wrap(self, model, optimizer, **kwargs):
        """Data-parallel model and optimizer for this run's backend and group."""
        from ddlcourse.parallel.data_parallel import wrap
        if self.world_size == 1:
            return model, optimizer
        return wrap(model, optimizer, backend=self.backend, group=self.group, **kwargs)


def setup(backend: str = "ddp", ranks: int | None = None, seed: int = 0,
          progress_file: str | None = None) -> RunContext | None:
    """Initialise the distributed run on this rank; returns ``None`` on ranks not taking part.

    ``ranks``: use only the first ``ranks`` MPI ranks (scaling experiments inside one cluster);
    ``None`` = all. The horovod backend always uses all ranks.
    """
    from ddlcourse import dist

    if backend not in ("ddp", "horovod", "allreduce"):
        raise ValueError(f"unknown backend {backend!r}; choose ddp, horovod or allreduce")
    info = dist.init(horovod=(backend == "horovod"))
    n = info.world_size if ranks is None else int(ranks)
    if backend == "horovod" and n != info.world_size:
        raise ValueError(f"the horovod backend spans the whole world ({info.world_size} ranks); "
                         f"got ranks={n}. Use backend='ddp' to run on a subset of ranks")
    comm, group = dist.subgroup(n)
    if comm is None:
        return None
    torch.manual_seed(dist.seed_for_rank(seed, 0))  # same initial model on every rank
    return RunContext(rank=info.rank, world_size=n, device=info.device, backend=backend, comm=comm,
                      group=None if n == info.world_size else group, progress_file=progress_file)


def seed_epoch(seed: int, epoch: int, rank: int) -> int:
    """Seed for the random work of one epoch on one rank (data order, augmentation): resumable."""
    from ddlcourse.dist import seed_for_rank
    s = seed_for_rank(seed + 7919 * epoch, rank)
    torch.manual_seed(s)
    return s


# --------------------------------------------------------------------------- progress
class Progress:
    """A tqdm bar on rank 0 (command line) that also writes ``progress_file`` for a notebook to follow."""

    def __init__(self, total: int, desc: str = "", enabled: bool = True, progress_file: str | None = None):
        self.total, self.n, self.enabled, self.file = total, 0, enabled, progress_file
        self.desc = desc
        self.bar = None
        if enabled and not progress_file:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, desc=desc, mininterval=1.0)
        self._last_write = 0.0

    def update(self, n: int = 1, **postfix) -> None:
        if not self.enabled:
            return
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()},
                                     refresh=False)
        if self.file and (time.time() - self._last_write > 0.3 or self.n >= self.total):
            tmp = self.file + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"n": self.n, "total": self.total, "desc": self.desc, "postfix": postfix}, f)
            os.replace(tmp, self.file)
            self._last_write = time.time()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run(cluster, fn, *args, desc: str = "training", poll: float = 0.5, **kwargs) -> list:
    """Call ``fn(*args, progress_file=..., **kwargs)`` on every engine and show rank 0's progress live.

    ``fn`` must accept a ``progress_file`` keyword (``train`` functions pass it to :func:`setup`).
    Returns the per-rank results in rank order (ranks that did not take part return ``None``).
    """
    from tqdm.auto import tqdm

    pfile = str(results_dir("_progress") / f"{desc.replace(' ', '_')}-{os.getpid()}-{time.time_ns()}.json")
    ar = cluster.view.apply_async(fn, *args, progress_file=pfile, **kwargs)
    bar = None
    try:
        while not ar.ready():
            time.sleep(poll)
            try:
                with open(pfile) as f:
                    p = json.load(f)
            except (OSError, json.JSONDecodeError):
                continue
            if bar is None:
                bar = tqdm(total=p["total"], desc=desc)
            bar.update(p["n"] - bar.n)
            if p.get("postfix"):
                bar.set_postfix(p["postfix"], refresh=False)
        return ar.get()
    finally:
        if bar is not None:
            bar.close()
        if os.path.exists(pfile):
            os.unlink(pfile)


# --------------------------------------------------------------------------- checkpoints
class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read."""


class Checkpointer:
    """Per-epoch checkpoints in ``folder``: written atomically by rank 0, the last ``keep`` kept.

    Files hold only tensors and plain Python values, so they load with ``torch.load(weights_only=True)``.
    If the newest file is corrupt, the previous one is used (with a warning): no finished epoch is lost twice.
    """

    def __init__(self, folder: Path | str, ctx: RunContext | None = None, keep: int = 2):
        self.folder = Path(folder)
        self.ctx = ctx
        self.keep = keep
        if ctx is None or ctx.is_root:
            self.folder.mkdir(parents=True, exist_ok=True)

    def _files(self) -> list[Path]:
        return sorted(self.folder.glob("epoch-*.pt"), key=lambda p: int(p.stem.split("-")[1]))

    def save(self, epoch: int, model, optimizer=None, **extra) -> None:
        """Save after ``epoch`` epochs are done (call on every rank; rank 0 writes)."""
        if self.ctx is None or self.ctx.is_root:
            from ddlcourse.parallel.data_parallel import unwrap
            state = {"epoch": int(epoch), "model": unwrap(model).state_dict(), "extra": extra}
            if optimizer is not None:
                state["optimizer"] = optimizer.state_dict()
            path = self.folder / f"epoch-{epoch:04d}.pt"
            tmp = path.with_suffix(".tmp")
            torch.save(state, tmp)
            os.replace(tmp, path)
            for old in self._files()[:-self.keep]:
                old.unlink(missing_ok=True)
        if self.ctx is not None:
            self.ctx.barrier()

    def load(self, model, optimizer=None) -> tuple[int, dict]:
        """Restore the newest readable checkpoint; returns ``(epochs_done, extra)`` (``(0, {})`` if none)."""
        from ddlcourse.parallel.data_parallel import unwrap
        errors = []
        for path in reversed(self._files()):
            try:
                state = torch.load(path, map_location="cpu", weights_only=True)
                unwrap(model).load_state_dict(state["model"])
                if optimizer is not None and "optimizer" in state:
                    optimizer.load_state_dict(state["optimizer"])
            except Exception as e:  # corrupt, truncated or from another model
                errors.append(f"{path.name}: {type(e).__name__}: {str(e)[:200]}")
                warnings.warn(f"checkpoint {path} is unreadable ({errors[-1]}); trying an older one", stacklevel=2)
                continue
            return int(state["epoch"]), dict(state.get("extra", {}))
        if errors:
            raise CheckpointError(
                f"no readable checkpoint in {self.folder} ({'; '.join(errors)}). "
                "Delete the folder to start afresh, or check that the model settings match the run that wrote it.")
        return 0, {}

    def clear(self) -> None:
        if self.ctx is None or self.ctx.is_root:
            for f in self._files():
                f.unlink(missing_ok=True)
        if self.ctx is not None:
            self.ctx.barrier()


# --------------------------------------------------------------------------- scaling experiments
def scaling_experiment(cluster, fn, make_cfg, ranks=(1, 2, 4), desc: str = "scaling", **kwargs) -> dict:
    """Run ``fn(make_cfg(k))`` on the first ``k`` ranks for each ``k`` in ``ranks``, in one cluster.

    ``fn`` returns a dict on rank 0 with at least ``seconds`` (training time) and ``samples`` (samples
    processed); other keys (metrics) are kept. Returns ``{k: rank-0 result}``.
    """
    out = {}
    for k in ranks:
        if k > cluster.n:
            raise ValueError(f"scaling to {k} ranks needs a cluster of at least {k} engines (it has {cluster.n})")
        res = run(cluster, fn, make_cfg(k), desc=f"{desc} on {k} rank(s)", **kwargs)
        out[k] = res[0]
    return out
