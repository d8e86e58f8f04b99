"""The one skeleton every case study (``ddlcourse.cases.<case>``) is built on: config, CLI, run context,
process groups, device, timers, checkpoints, results and progress. A case keeps only its science.

A case declares its settings once, as a dataclass, and gets validated ``key=value`` overrides for free::

    @dataclass(kw_only=True)                        # fields with and without defaults, in any order
    class Config(training.CaseConfig):
        CASE: ClassVar[str] = "maize"              # results/maize/, messages "unknown maize setting ..."
        SECTION: ClassVar[str] = "lab_maize"       # sizes from config.sizes(SECTION, scale)
        n_train: int                                # filled from the scale profile
        epochs: int
        lr: float
        syncbn: bool = True                         # a run option of this case

        def validate(self):                         # the case's own checks (the base checks run first)
            super().validate()
            ...

    def make_config(scale=None, **overrides) -> Config:
        return training.make_config(Config, Config.SECTION, scale, **overrides)

    def cli(argv, scale=None, backend=None) -> int:
        return training.case_cli(sys.modules[__name__], argv, scale, backend)

``CaseConfig`` holds the run options every case shares: ``scale``, ``backend`` (ddp | horovod), ``ranks``
(the first k MPI ranks; None = all), ``seed``, ``run_name`` and ``fresh`` (False = resume from the last
checkpoint). Values are coerced to the field's type and range-checked when the config is built
(``epochs >= 1``, ``lr > 0``, batch sizes >= 1, ...): see :meth:`CaseConfig.validate`.

Inside ``train(cfg)``, on every rank (ipyparallel engine, ``mpiexec`` or ``srun``)::

    ctx = training.setup(cfg, mesh=(None, cfg.mp), progress_file=progress_file)   # None: rank not in the run
    if ctx is None:
        return None
    model = ctx.to(build_model(cfg))                     # on this rank's device (GPU of the local rank, else CPU)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    ckpt = ctx.checkpointer(CASE, stage=None, epochs=cfg.epochs)   # fresh=True clears it; says when it resumes
    start, extra = ckpt.load(model, opt)                 # map_location=ctx.device, weights_only=True
    model, opt = ctx.wrap(model, opt)                    # DDP / Horovod over the data-parallel ranks
    bar = ctx.progress(total_steps, desc=CASE)
    for epoch in range(start, cfg.epochs):
        for idx in ctx.batches(n_train, cfg.global_batch, epoch, drop_last=True):   # this rank's share
            x, y = ctx.to((X[idx], Y[idx]))              # every batch on ctx.device
            with ctx.timer() as t:                       # synchronises CUDA before reading the clock
                loss = step(model, opt, x, y)
            seconds += t.seconds
            bar.update(loss=ctx.mean(loss.item()))       # mean over the run's ranks
        ckpt.save(epoch + 1, model, opt, history=history)
    bar.close()
    ctx.write_result(CASE, summary)                       # results/<case>/result-<run_name>.json, rank 0 only

``mesh=(dp, mp)``: the run's ranks as a grid ``arange(n).view(dp, mp)`` (``dp=None``: n // mp). Rows are
model-parallel groups of neighbouring ranks (one replica), columns data-parallel groups. The torch groups
and mpi4py communicators are built once per grid (every rank of the world takes part, in the same order)
and reused by every later run: ``ctx.mesh`` has ``dp, mp, dp_rank, mp_rank, dp_group, mp_group, dp_comm,
mp_comm, dp_ranks, mp_ranks``.

Command line (one for every case)::

    mpiexec -n 4 python -m ddlcourse run maize --scale laptop --backend ddp [--fresh] [seg_epochs=3 lr=1e-3]

From a notebook::

    results = training.run(c, maize.train, cfg, desc="maize")     # live progress bar, results per rank
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from ddlcourse import config, sharding
from ddlcourse.device import now as device_now, synchronize as device_synchronize

BACKENDS = ("ddp", "horovod")


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


def run_dir(name: str) -> Path:
    """A new, empty folder for one run under ``results/<name>/``: checkpoints and files that ranks on other
    nodes read. It is on the shared file system the checkout is on, never a node-local ``/tmp`` (a rank on
    another node would find nothing there)."""
    parent = results_dir(name)
    for i in range(1000):
        d = parent / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{i}"
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise RuntimeError(f"could not make a new run folder under {parent}")


# --------------------------------------------------------------------------- configuration
class ConfigError(ValueError):
    """A setting that does not exist, has the wrong type or is out of range."""


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(name: str, value, tp):
    """``value`` as the type ``tp`` of the setting ``name`` (strings from the command line are parsed)."""
    shown = value if isinstance(value, str) else repr(value)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for a in (a for a in args if a is not type(None)):
            try:
                return coerce(name, value, a)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else
                          f"{name}={shown}: expected one of {', '.join(_type_name(a) for a in args)}")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.strip().strip("[]()").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}={shown}: expected a list, e.g. {name}=1,2,3")
        elem = args[0] if args else typing.Any
        try:
            return origin(coerce(name, v.strip() if isinstance(v, str) else v, elem) for v in value)
        except ConfigError:
            raise ConfigError(f"{name}={shown}: expected a list of {_type_name(elem)}") from None
    if tp is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{name}={shown}: expected true or false")
    if tp is int:
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            return int(value)
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{name}={shown}: expected a whole number")
    if tp is float:
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
            out = float(value)
        elif isinstance(value, str):
            try:
                out = float(value.strip())
            except ValueError:
                raise ConfigError(f"{name}={shown}: expected a number, e.g. {name}=1e-3") from None
        else:
            raise ConfigError(f"{name}={shown}: expected a number")
        if not math.isfinite(out):
            raise ConfigError(f"{name}={shown}: expected a finite number")
        return out
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name}={shown}: expected text")
    return value                                   # any other annotation: taken as given


def _positive_int(name: str) -> bool:
    """Settings that count things and must be >= 1 (by the course's naming)."""
    return (name in ("per_chunk", "chunk_size", "width", "depth", "levels")
            or name.endswith(("batch", "batches")) or name.startswith("n_"))


@dataclass(kw_only=True)
class CaseConfig:
    """The run options every case shares; a case subclasses it with its own fields (see the module doc).

    Building one (directly, with :func:`make_config` or :func:`dataclasses.replace`) coerces every value to its
    field's type and runs :meth:`validate`, so a config that exists is a config that makes sense.
    """

    CASE: ClassVar[str] = "case"
    SECTION: ClassVar[str | None] = None
    MIN_EPOCHS: ClassVar[int] = 1                  # a case may allow 0 (evaluate only)

    scale: str = field(default_factory=lambda: config.get_scale())
    backend: str = "ddp"                           # ddp | horovod
    ranks: int | None = None                       # the first `ranks` MPI ranks (scaling in one cluster); None = all
    seed: int = 0
    run_name: str = "default"                      # checkpoints and results are kept per run name
    fresh: bool = False                            # True: clear this run's checkpoints and start at epoch 0

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            if f.init:
                setattr(self, f.name, coerce(f.name, getattr(self, f.name), hints.get(f.name, typing.Any)))
        self.validate()

    def validate(self) -> None:
        """Range checks by name; a case extends this (call ``super().validate()``) with its own rules."""
        try:
            self.scale = config.get_scale(self.scale)
        except config.ScaleError as e:
            raise ConfigError(str(e)) from None
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.ranks is not None and self.ranks < 1:
            raise ConfigError(f"ranks={self.ranks}: must be >= 1 (or None for all ranks)")
        if self.seed < 0:
            raise ConfigError(f"seed={self.seed}: must be >= 0")
        if not self.run_name or any(c in self.run_name for c in "/\\") or self.run_name.startswith("."):
            raise ConfigError(f"run_name={self.run_name!r}: must be a plain folder name (no '/', not starting with '.')")
        for f in dataclasses.fields(self):
            v, k = getattr(self, f.name), f.name
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if (k == "epochs" or k.endswith("_epochs")) and v < self.MIN_EPOCHS:
                raise ConfigError(f"{k}={v}: must be >= {self.MIN_EPOCHS}")
            if (k == "lr" or k.endswith("_lr")) and v <= 0:
                raise ConfigError(f"{k}={v}: the learning rate must be > 0")
            if _positive_int(k) and v < 1:
                raise ConfigError(f"{k}={v}: must be >= 1")
            if k.endswith("_steps") and v < 0:
                raise ConfigError(f"{k}={v}: must be >= 0")

    @classmethod
    def settings(cls) -> list[str]:
        """The names a user may set (``key=value``)."""
        return [f.name for f in dataclasses.fields(cls) if f.init]


def _unknown(cls, keys) -> ConfigError:
    return ConfigError(f"unknown {cls.CASE} setting(s) {', '.join(sorted(keys))}; "
                       f"known settings: {', '.join(sorted(cls.settings()))}")


def make_config(cls, section: str | None = None, scale: str | None = None, **overrides):
    """``cls`` with the sizes of ``section`` at ``scale`` (:func:`ddlcourse.config.sizes`), then ``overrides``.

    Section sizes that ``cls`` does not declare (sizes of the notebook only, such as ``n_engines``) are left out.
    Unknown overrides, values of the wrong type and values out of range raise :class:`ConfigError`.
    """
    section = section or cls.SECTION
    names = set(cls.settings())
    unknown = set(overrides) - names
    if unknown:
        raise _unknown(cls, unknown)
    try:
        s = config.sizes(section, scale) if section else None
    except config.ScaleError as e:
        raise ConfigError(str(e)) from None
    base = {k: v for k, v in vars(s).items() if k in names} if s is not None else {}
    if s is not None:
        base["scale"] = s.scale
    return cls(**{**base, **overrides})


def parse_overrides(cls, items: list[str]) -> dict:
    """``["epochs=3", "lr=1e-3"]`` -> ``{"epochs": 3, "lr": 0.001}``, typed by the fields of ``cls``."""
    hints = typing.get_type_hints(cls)
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {item!r} (e.g. epochs=3)")
        if key not in cls.settings():
            raise _unknown(cls, [key])
        out[key] = coerce(key, value, hints.get(key, typing.Any))
    return out


def summary(result: dict) -> dict:
    """The plain values of a result (numbers, text, small dicts of them): for printing and result files."""
    out = {}
    for k, v in result.items():
        if isinstance(v, (bool, int, float, str)) or v is None:
            out[k] = v
        elif isinstance(v, (np.integer, np.floating)):
            out[k] = v.item()
        elif isinstance(v, dict):
            sub = summary(v)
            if sub:
                out[k] = sub
    return out


def _json_default(o):
    if torch.is_tensor(o):
        return o.detach().cpu().tolist()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.integer, np.floating, np.bool_)):
        return o.item()
    if isinstance(o, (Path, torch.device)):
        return str(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def to_json(obj) -> str:
    """JSON of a result: tensors (moved to the CPU), NumPy arrays and scalars become lists and numbers."""
    return json.dumps(obj, indent=1, default=_json_default)


def _usage(mod, scale) -> str:
    cfg = mod.make_config(scale)
    lines = [f"python -m ddlcourse run {cfg.CASE} [--scale S] [--backend ddp|horovod] [--fresh] [key=value ...]",
             "", f"settings (values at scale {cfg.scale}):"]
    hints = typing.get_type_hints(type(cfg))
    for k in cfg.settings():
        lines.append(f"  {k:<20} = {getattr(cfg, k)!r:<24} {_type_name(hints.get(k))}")
    lines += ["", f"set one with key=value, e.g. python -m ddlcourse run {cfg.CASE} --scale {cfg.scale} epochs=1"
                  if "epochs" in cfg.settings() else "set one with key=value"]
    return "\n".join(lines)


def case_cli(mod, argv: list[str], scale: str | None = None, backend: str | None = None) -> int:
    """The command line of every case: ``[--fresh] [key=value ...]``; trains and prints the summary on rank 0.

    ``mod`` is the case module (``make_config``, ``Config``, ``train``, optionally ``summary``). Returns the exit
    status: 0, or 2 with a clear message for bad settings, data or checkpoints.
    """
    from ddlcourse import dist
    name = mod.Config.CASE
    try:
        items, fresh = [], False
        for a in argv:
            if a == "--fresh":
                fresh = True
            elif a in ("-h", "--help"):
                if dist.rank() == 0:
                    print(_usage(mod, scale))
                return 0
            elif a.startswith("-"):
                raise ConfigError(f"unknown option {a!r}: settings are given as key=value (e.g. epochs=3); "
                                  f"known settings: {', '.join(sorted(mod.Config.settings()))}")
            else:
                items.append(a)
        over = parse_overrides(mod.Config, items)
        if backend is not None:
            over.setdefault("backend", backend)
        if fresh:
            over["fresh"] = True
        over.setdefault("run_name", "cli")              # keep the notebook's runs apart
        cfg = mod.make_config(scale, **over)
    except ValueError as e:                           # the same on every rank: say it once
        if dist.rank() == 0:
            print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    try:
        res = mod.train(cfg)
    except (ValueError, FileNotFoundError, CheckpointError) as e:   # bad data, settings or checkpoint
        print(f"{name}: error (rank {dist.rank()}): {e}", file=sys.stderr)
        return 2
    if res is not None and dist.rank() == 0:
        print(to_json(getattr(mod, "summary", summary)(res)))
    return 0


# --------------------------------------------------------------------------- process groups: one grid, built once
@dataclass
class Mesh:
    """This rank's place in the run's ``dp x mp`` grid, and the groups along both axes."""

    dp: int
    mp: int
    dp_rank: int              # which replica (row of the grid)
    mp_rank: int              # which part of the replica (column)
    dp_group: object = None   # torch group: the same part of every replica (gradients are averaged here)
    mp_group: object = None   # torch group: the parts of one replica (None when mp == 1)
    dp_comm: object = None    # mpi4py communicators of the same ranks
    mp_comm: object = None

    @property
    def dp_ranks(self) -> list[int]:
        return [i * self.mp + self.mp_rank for i in range(self.dp)]

    @property
    def mp_ranks(self) -> list[int]:
        return [self.dp_rank * self.mp + j for j in range(self.mp)]


_GRIDS: dict = {"world": None, "meshes": {}}


def _default_group():
    import torch.distributed as tdist
    return tdist.distributed_c10d._get_default_group() if tdist.is_initialized() else None


def grid(n: int, dp: int, mp: int, comm, run_group) -> Mesh | None:
    """The groups of the grid ``arange(n).view(dp, mp)`` over the first ``n`` ranks (collective over the world).

    Built once per ``(n, dp, mp)`` and per ``torch.distributed`` world; later calls return the cached mesh.
    ``comm``/``run_group``: the run's mpi4py communicator and torch group (None on ranks outside the run).
    """
    import torch.distributed as tdist
    world = _default_group()
    if _GRIDS["world"] is not world:                  # a new torch.distributed world: old groups are gone
        _GRIDS["world"], _GRIDS["meshes"] = world, {}
    key = (n, dp, mp)
    if key not in _GRIDS["meshes"]:
        r = tdist.get_rank() if world is not None else 0
        inside = r < n
        dp_rank, mp_rank = (r // mp, r % mp) if inside else (None, None)
        mesh = Mesh(dp, mp, dp_rank, mp_rank) if inside else None
        if mp == 1:
            if inside:
                mesh.dp_group, mesh.dp_comm = run_group, comm
        else:
            ranks = torch.arange(n).view(dp, mp)
            for i in range(dp):                       # every rank of the world calls every new_group
                g = tdist.new_group(ranks[i].tolist())
                if inside and dp_rank == i:
                    mesh.mp_group = g
            for j in range(mp):
                g = tdist.new_group(ranks[:, j].tolist())
                if inside and mp_rank == j:
                    mesh.dp_group = g
            if inside:                                # collective over the run's ranks only
                mesh.mp_comm = comm.Split(dp_rank, mp_rank)
                mesh.dp_comm = comm.Split(mp_rank, dp_rank)
        _GRIDS["meshes"][key] = mesh
    return _GRIDS["meshes"][key]


# --------------------------------------------------------------------------- run context
class Timer:
    """``with ctx.timer() as t: ...`` -> ``t.seconds``; the device is synchronised at both ends."""

    def __init__(self, ctx: "RunContext"):
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
    mesh: Mesh | None = None
    cfg: CaseConfig | None = None
    _t0: float = field(default_factory=time.perf_counter)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def log(self, *msg) -> None:
        """Print on rank 0 only."""
        if self.is_root:
            print(*msg, flush=True)

    def progress(self, total: int, desc: str = "") -> "Progress":
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
        from mpi4py import MPI
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
        dp, dp_rank = (self.mesh.dp, self.mesh.dp_rank) if self.mesh else (self.world_size, self.rank)
        seed = (self.cfg.seed if self.cfg is not None else 0) if seed is None else seed
        return sharding.sharded_batches(n, global_batch, dp_rank, dp, epoch, seed, shuffle, drop_last)

    def seed_epoch(self, epoch: int, seed: int | None = None) -> int:
        return seed_epoch((self.cfg.seed if self.cfg is not None else 0) if seed is None else seed, epoch, self.rank)

    def checkpointer(self, case: str, stage: str | None = None, epochs: int | None = None,
                     run_name: str | None = None, keep: int = 2) -> "RunCheckpointer":
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
        if self.mesh is not None and self.mesh.mp > 1:
            folder, label = folder / f"part{self.mesh.mp_rank}", f"{label}/part{self.mesh.mp_rank}"
            writer = self.mesh.dp_rank == 0
        ck = RunCheckpointer(folder, self, keep=keep, label=label, epochs=epochs, writer=writer)
        if self.cfg is not None and self.cfg.fresh:
            ck.clear()
        return ck

    def write_result(self, case: str, result: dict, name: str | None = None) -> Path | None:
        """Write ``results/<case>/result-<run_name>.json`` on rank 0 (tensors and arrays as lists); its path."""
        if not self.is_root:
            return None
        name = name or (self.cfg.run_name if self.cfg is not None else "default")
        path = results_dir(case) / f"result-{name}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(to_json(result))
        os.replace(tmp, path)
        return path

    # ---- the model
    def wrap(self, model, optimizer, **kwargs):
        """Data-parallel model and optimizer for this run's backend, over the data-parallel ranks."""
        from ddlcourse.parallel.data_parallel import wrap
        wrong = {str(p.device) for p in model.parameters() if p.device != self.device}
        if wrong:
            raise RuntimeError(f"the model has parameters on {', '.join(sorted(wrong))} but this rank's device is "
                               f"{self.device}: build it with ctx.to(model) before making the optimizer")
        dp = self.mesh.dp if self.mesh else self.world_size
        if dp == 1:
            return model, optimizer
        if self.mesh and self.mesh.mp > 1 and self.backend == "horovod":
            # Horovod averages over every rank; the mp ranks of a row hold different parts of the model
            raise ConfigError("Horovod averages gradients over all ranks, but this run's model is split over "
                              f"mp={self.mesh.mp} ranks: use backend='ddp', or average the gradients yourself")
        group = self.mesh.dp_group if self.mesh and self.mesh.mp > 1 else self.group
        return wrap(model, optimizer, backend=self.backend, group=group, **kwargs)


def _mesh_shape(mesh, n: int) -> tuple[int, int]:
    dp, mp = mesh if mesh is not None else (n, 1)
    mp = int(mp)
    if mp < 1 or n % mp:
        raise ConfigError(f"mesh: mp={mp} must divide the number of ranks {n}")
    dp = n // mp if dp is None else int(dp)
    if dp * mp != n:
        raise ConfigError(f"mesh (dp={dp}, mp={mp}) has {dp * mp} places but the run has {n} ranks")
    return dp, mp


def setup(cfg=None, mesh: tuple | None = None, *, progress_file: str | None = None, backend: str | None = None,
          ranks: int | None = None, seed: int | None = None) -> RunContext | None:
    """Initialise the run on this rank; ``None`` on ranks not taking part. Call it on every rank of the world.

    ``cfg``: a :class:`CaseConfig` (its ``backend``, ``ranks`` and ``seed``). ``mesh=(dp, mp)`` lays the run's
    ranks out as a grid (``dp=None``: ``n // mp``); default ``(n, 1)``, plain data parallelism. The older
    form ``setup("ddp", ranks=k, seed=s)`` still works. The horovod backend always uses all ranks.
    """
    from ddlcourse import dist

    if cfg is None or isinstance(cfg, str):
        backend, cfg = cfg or backend or "ddp", None
    else:
        backend, ranks, seed = cfg.backend, cfg.ranks, cfg.seed
    if backend not in ("ddp", "horovod", "allreduce"):
        raise ValueError(f"unknown backend {backend!r}; choose ddp, horovod or allreduce")
    info = dist.init(horovod=(backend == "horovod"))
    n = info.world_size if ranks is None else int(ranks)
    if not 1 <= n <= info.world_size:
        raise ConfigError(f"ranks={n} but {info.world_size} MPI rank(s) are running")
    if backend == "horovod" and n != info.world_size:
        raise ConfigError(f"the horovod backend spans the whole world ({info.world_size} ranks); "
                          f"got ranks={n}. Use backend='ddp' to run on a subset of ranks")
    dp, mp = _mesh_shape(mesh, n)
    comm, group = dist.subgroup(n)                    # collective over the world, cached
    m = grid(n, dp, mp, comm, None if n == info.world_size else group)   # collective too, cached
    if comm is None:
        return None
    torch.manual_seed(dist.seed_for_rank(seed or 0, 0))   # the same initial model on every rank
    return RunContext(rank=info.rank, world_size=n, device=info.device, backend=backend, comm=comm,
                      group=None if n == info.world_size else group, progress_file=progress_file, mesh=m, cfg=cfg)


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


FRESH_ADVICE = "run again with --fresh (or fresh=True) to start over"


def _why_unreadable(e: Exception, stage: str) -> str:
    """A short reason in the course's words (torch's own advice about weights_only is not for learners)."""
    if stage == "file":
        return "not a readable checkpoint file (truncated, corrupt or not written by this course)"
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"it does not fit this model ({first[:160]})"


class Checkpointer:
    """Per-epoch checkpoints in ``folder``: written atomically by rank 0, the last ``keep`` kept.

    Files hold only tensors and plain Python values, so they load with ``torch.load(weights_only=True)``,
    onto the run's device (``map_location``). If the newest file is unreadable, the previous one is used
    (with a warning): no finished epoch is lost twice. If none is readable, :class:`CheckpointError` names
    the files and says how to start over.
    """

    def __init__(self, folder: Path | str, ctx: RunContext | None = None, keep: int = 2):
        self.folder = Path(folder)
        self.ctx = ctx
        self.keep = keep
        self.loaded: Path | None = None               # the file the last load() restored
        if self.writes:
            self.folder.mkdir(parents=True, exist_ok=True)

    @property
    def writes(self) -> bool:
        """Whether this rank writes the files (rank 0; subclasses may name another writer)."""
        return self.ctx is None or self.ctx.is_root

    def _files(self) -> list[Path]:
        return sorted(self.folder.glob("epoch-*.pt"), key=lambda p: int(p.stem.split("-")[1]))

    def save(self, epoch: int, model, optimizer=None, **extra) -> None:
        """Save after ``epoch`` epochs are done (call on every rank; rank 0 writes)."""
        if self.writes:
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
        device = getattr(self.ctx, "device", None) or "cpu"
        errors = []
        files = self._files()
        for i, path in enumerate(reversed(files)):
            stage = "file"
            try:
                state = torch.load(path, map_location=device, weights_only=True)
                stage = "state"
                unwrap(model).load_state_dict(state["model"])
                if optimizer is not None and "optimizer" in state:
                    optimizer.load_state_dict(state["optimizer"])
            except Exception as e:  # corrupt, truncated or from another model
                errors.append(f"{path} is unreadable: {_why_unreadable(e, stage)}")
                more = "; trying an older one" if i + 1 < len(files) else ""
                warnings.warn(f"checkpoint {errors[-1]}{more}", stacklevel=2)
                continue
            self.loaded = path
            return int(state["epoch"]), dict(state.get("extra", {}))
        if errors:
            raise CheckpointError(
                f"no readable checkpoint in {self.folder}: {'; '.join(errors)}. {FRESH_ADVICE[0].upper()}"
                f"{FRESH_ADVICE[1:]}, or check that the model settings match the run that wrote it.")
        return 0, {}

    def clear(self) -> None:
        if self.writes:
            for f in self._files():
                f.unlink(missing_ok=True)
        if self.ctx is not None:
            self.ctx.barrier()


class RunCheckpointer(Checkpointer):
    """The checkpointer of a run context (:meth:`RunContext.checkpointer`): says on rank 0 when it resumes."""

    def __init__(self, folder, ctx, keep: int = 2, label: str = "", epochs: int | None = None,
                 writer: bool | None = None):
        self._writer = writer                    # None: rank 0 writes; else whether this rank writes
        super().__init__(folder, ctx, keep)
        self.label, self.epochs = label or self.folder.name, epochs

    @property
    def writes(self) -> bool:
        return super().writes if self._writer is None else self._writer

    def load(self, model, optimizer=None) -> tuple[int, dict]:
        done, extra = super().load(model, optimizer)
        if done and self.writes:
            of = f" of {self.epochs}" if self.epochs is not None else ""
            print(f"resuming {self.label} from epoch {done}{of} ({self.loaded})", flush=True)
            if self.epochs is not None and done >= self.epochs:
                print(f"{self.label}: all {self.epochs} epochs are done already (fresh=True trains again)", flush=True)
        return done, extra


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
