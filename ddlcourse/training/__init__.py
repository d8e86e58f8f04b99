"""The one skeleton every case study (``ddlcourse.cases.<case>``) is built on. A case keeps only its science
(data, model, metric, pictures, its ``Config`` and its ``train``); the rest lives here, one concern a module.

Modules
-------
config      settings: the ``CaseConfig`` dataclass, ``Config.make``, ``key=value``
cli         ``python -m ddlcourse run CASE ...`` and its ``--help``
context     ``setup``: one rank's run context, its grid of groups, device, timers
checkpoint  atomic checkpoint files and the per-epoch checkpointer
progress    progress bars, and the notebook's ``run`` on the engines (through ``MPICluster.run``)
results     ``results/<case>/`` and result files as JSON

A case declares its settings once, as a dataclass, and gets validated ``key=value`` overrides and the
command line for free::

    @dataclass(kw_only=True)                        # fields with and without defaults, in any order
    class Config(training.CaseConfig):
        CASE: ClassVar[str] = "maize"              # results/maize/, messages "unknown maize setting ..."
        SECTION: ClassVar[str] = "lab_maize"       # sizes from config.sizes(SECTION, scale)
        n_train: int = setting(min=1, help="training samples")     # no default: the scale profile fills it
        epochs: int = setting(min=1, help="passes over the data")
        lr: float = setting(above=0, help="the learning rate")
        syncbn: bool = setting(True, help="BatchNorm statistics of the global batch")   # a run option

        def validate(self):                         # the case's own checks (the base checks run first)
            super().validate()
            ...

    cfg = maize.Config.make("smoke", epochs=1)      # the sizes of lab_maize at smoke, then the overrides

``CaseConfig`` holds the run options every case shares: ``scale``, ``backend`` (one of :data:`BACKENDS`),
``ranks`` (the first k MPI ranks; None = all), ``seed``, ``run_name`` and ``fresh`` (False = resume from the
last checkpoint). Each field declares its rule and its ``--help`` text with :func:`setting`; every value is
converted to the field's type, once, and checked when the config is built: see :meth:`CaseConfig.validate`.

Inside ``train(cfg)``, on every rank (ipyparallel engine, ``mpiexec`` or ``srun``)::

    ctx = training.setup(cfg, mesh=(None, cfg.mp), progress_file=progress_file)   # None: rank not in the run
    if ctx is None:
        return None
    model = ctx.to(build_model(cfg))                     # on this rank's device (GPU of the local rank, else CPU)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    ckpt = ctx.checkpointer(CASE, stage=None, epochs=cfg.epochs)   # fresh=True clears it; says when it resumes
    start, extra = ckpt.load(model, opt)                 # map_location=ctx.device, weights_only=True
    model, opt = ctx.wrap(model, opt)                    # DDP / Horovod / allreduce over the data-parallel ranks
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
and reused by every later run: ``ctx.grid`` is the run's :class:`ddlcourse.grid.Grid` (``coord("dp")``,
``group("mp")``, ``comm("dp")``, ``ranks("mp")``, ...), and ``ctx.dp``, ``ctx.mp`` its sizes.

Command line (one for every case; ``--help`` after the case lists its settings at ``--scale``)::

    mpiexec -n 4 python -m ddlcourse run maize --scale laptop --backend ddp [--fresh] [seg_epochs=3 lr=1e-3]

From a notebook::

    results = training.run(c, maize.train, cfg, desc="maize")     # live progress bar, results per rank
"""
from __future__ import annotations

from ddlcourse.training.checkpoint import (FRESH_ADVICE, Checkpointer, CheckpointError, RunCheckpointer,
                                           atomic_save, load_into)
from ddlcourse.training.cli import RunArgs, case_cli, parse_args, settings_help, usage
from ddlcourse.training.config import (BACKENDS, CaseConfig, ConfigError, check_backend, check_scale, coerce,
                                       make_config, parse_overrides, setting, type_name, unknown_settings)
from ddlcourse.training.context import (RunContext, Timer, _mesh_shape, check_split_model, grid, seed_epoch,
                                        setup)
from ddlcourse.training.progress import Progress, run, scaling_experiment
from ddlcourse.training.results import repo_root, results_dir, run_dir, summary, to_json, write_text_atomic

__all__ = [
    "BACKENDS", "CaseConfig", "ConfigError", "check_backend", "check_scale", "coerce", "make_config",
    "parse_overrides", "setting", "type_name", "unknown_settings",
    "RunArgs", "case_cli", "parse_args", "settings_help", "usage",
    "RunContext", "Timer", "check_split_model", "grid", "seed_epoch", "setup",
    "FRESH_ADVICE", "Checkpointer", "CheckpointError", "RunCheckpointer", "atomic_save", "load_into",
    "Progress", "run", "scaling_experiment",
    "repo_root", "results_dir", "run_dir", "summary", "to_json", "write_text_atomic",
    "_mesh_shape",                                  # the tests check the grid's shape rules through it
]
