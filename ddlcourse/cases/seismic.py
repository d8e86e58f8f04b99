"""Case study: 3-D seismic facies classification, 2-D sections against 3-D cubes, past one rank's memory.

    mpiexec -n 4 python -m ddlcourse run seismic --scale laptop [--fresh] [model=2d|3d spatial=2 cube=64,32,32]

``train(cfg)`` runs on every rank (ipyparallel engines or ``mpiexec``) and returns a result dict on each; the
model and every cube sit on the rank's device (``ctx.device``). The options that make this case (besides the
sizes of the ``lab_seismic`` scale section, all in :class:`Config`):

* ``model``   -- ``"2d"``: a U-Net on inline sections (each cube is cut into its ``x`` sections);
                 ``"3d"``: a U-Net on whole cubes.
* ``spatial`` -- ranks that share one cube (3-D only): the cube's depth is split into ``spatial`` slabs,
                 one per rank, with halo exchange in every convolution (``ddlcourse.parallel.spatial``).
                 The ``world_size`` ranks form a ``(world_size / spatial) x spatial`` grid
                 (``training.setup(cfg, mesh=(None, spatial))``): rows of neighbouring ranks share a cube,
                 columns are the data-parallel groups.
* ``memory_budget_mb`` -- the activation memory one rank may use for one cube (its slab); a cube that
                 needs more is refused before training, as a device would refuse it with out-of-memory.

Gradients. Each rank processes its cubes (its slabs of them) one at a time and accumulates gradients of
``loss_r = sum of its voxels' cross-entropy / (voxels per cube * global_batch)``: summed over all ranks,
``loss_r`` is the mean loss of the global batch. Every rank then scales by ``world_size`` and takes the mean
over ranks (the rule of notebook 03), which gives the serial gradient of the global batch for any split into
data-parallel groups and spatial slabs. ``backend`` picks how that mean is taken, over every rank of the run
(each holds the whole model): ``allreduce``, one allreduce per tensor once the step's cubes are done;
``ddp``, DistributedDataParallel, which skips the synchronisation on all but the step's last backward
(``no_sync``) and all-reduces its buckets while that backward runs; ``horovod``, Horovod's allreduce of each
tensor, started for all of them at once so that its background thread fuses them.

Data order. The global batch ``k`` of an epoch is a block of consecutive volumes (chunks); rank ``r`` of
the data-parallel groups uses the volumes of the block that it owns (``chunk % n_dp == r``), so the global
batch is the same for any number of ranks, and the loss trajectory too.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ddlcourse import dist, memory, metrics, training
from ddlcourse.training import setting
from ddlcourse.data import seismic as data
from ddlcourse.models import seismic as models
from ddlcourse.parallel import data_parallel
from ddlcourse.parallel.spatial import scatter_spatial

CASE = "seismic"
MODELS = ("2d", "3d")


class MemoryBudgetError(ValueError):
    """The activations of one cube (slab) do not fit the per-rank memory budget."""


# --------------------------------------------------------------------------- configuration
@dataclass(kw_only=True)
class Config(training.CaseConfig):
    """The ``lab_seismic`` sizes of a scale plus the run options of this case (``key=value`` on the CLI)."""

    CASE: ClassVar[str] = "seismic"
    SECTION: ClassVar[str] = "lab_seismic"
    volume: list[int] = setting(min=1, help="(depth, x, y) of a generated volume")
    cube: list[int] = setting(min=1, help="(depth, x, y) of a training cube")
    spatial_cube: list[int] = setting(min=1, help="a cube past one rank's budget (the lab's spatial runs)")
    cubes_per_volume: int = setting(min=1, help="training cubes cut from each volume")
    n_volumes: int = setting(min=1, help="training volumes")
    n_test: int = setting(min=1, help="held-out volumes")
    global_batch: int = setting(min=1, help="cubes per step, over all ranks")
    width: int = setting(min=1, help="channels of the U-Net's first level")
    levels: int = setting(min=1, help="levels of the U-Net")
    epochs: int = setting(min=1, help="passes over the training cubes")
    lr: float = setting(above=0, help="Adam's learning rate")
    memory_budget_mb: float = setting(0.0, min=0, help="activation MB one rank may use for one cube (its slab); "
                                                       "0: no limit")
    memory_edges: list[int] = setting(default_factory=list, min=1, help="cube edges of the lab's memory curve")
    scaling_epochs: int = setting(1, min=1, help="epochs of the lab's scaling runs")
    model: str = setting("3d", choices=MODELS, help="2d: U-Net on inline sections; 3d: U-Net on cubes")
    spatial: int = setting(1, min=1, help="ranks that split one cube's depth (3d only)")
    return_example: bool = setting(False, help="rank 0 returns one test volume with its prediction")

    def validate(self) -> None:
        super().validate()
        for k in ("volume", "cube", "spatial_cube"):
            v = getattr(self, k)
            if len(v) != 3:
                raise training.ConfigError(f"{k}={v}: expected three sizes (depth, x, y) >= 1")
        s = self.spatial
        if s > 1 and self.model != "3d":
            raise training.ConfigError("spatial parallelism splits a cube's depth: use it with model='3d'")
        if self.ranks is not None and self.ranks % s:
            raise training.ConfigError(f"spatial={s} must divide the number of ranks ({self.ranks})")
        if self.global_batch % self.cubes_per_volume:
            raise training.ConfigError(f"global_batch={self.global_batch} must be a multiple of cubes_per_volume="
                                       f"{self.cubes_per_volume}")
        f = 2 ** self.levels
        if self.cube[0] % (s * f) or any(c % f for c in self.cube[1:]):
            raise training.ConfigError(f"cube {tuple(self.cube)}: depth must be divisible by spatial*2**levels = "
                                       f"{s * f}, x and y by {f}")


def check_cfg(cfg: Config, world_size: int) -> None:
    """The checks that need the number of ranks, before any work is done."""
    s = cfg.spatial
    if world_size % s:
        raise training.ConfigError(f"spatial={s} must divide the number of ranks ({world_size})")
    n_dp = world_size // s
    if (cfg.global_batch // cfg.cubes_per_volume) % n_dp:
        raise training.ConfigError(f"global_batch={cfg.global_batch} must be a multiple of cubes_per_volume="
                                   f"{cfg.cubes_per_volume} times the data-parallel groups ({n_dp})")


def preflight(cfg: Config, world_size: int) -> float:
    """Check the options and the memory wall; returns the predicted activation MB per rank.

    A cube whose activations exceed ``memory_budget_mb`` on one rank is refused, as a device would
    refuse it (out of memory).
    """
    check_cfg(cfg, world_size)
    need_mb = predicted_activation_mb(cfg)
    if cfg.memory_budget_mb and need_mb > cfg.memory_budget_mb:
        raise MemoryBudgetError(
            f"a {tuple(cfg.cube)} cube needs {need_mb:.1f} MB of activations per rank (spatial={cfg.spatial}), "
            f"over the budget of {cfg.memory_budget_mb} MB: split it across more ranks (spatial=...), use a "
            "smaller cube, or activation checkpointing")
    return need_mb


# --------------------------------------------------------------------------- pieces of a step
def build_model(cfg):
    if cfg.model == "3d":
        return models.cube_model(cfg.width, cfg.levels, data.N_FACIES)
    return models.section_model(cfg.width, cfg.levels, data.N_FACIES)


def model_input(cfg, cube: np.ndarray) -> torch.Tensor:
    """One cube (depth, x, y) as the model's batch: (1, 1, D, X, Y) for 3-D, (X, 1, D, Y) sections for 2-D."""
    t = torch.from_numpy(np.ascontiguousarray(cube))
    if cfg.model == "3d":
        return t[None, None]
    return t.permute(1, 0, 2)[:, None]                # inline sections: (x, 1, depth, y)


def model_target(cfg, labels: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(labels)).long()
    return t[None] if cfg.model == "3d" else t.permute(1, 0, 2)


def predict_volume(model, cfg, seismic: np.ndarray) -> np.ndarray:
    """Facies of a whole volume (depth, x, y): one pass for 3-D, one inline at a time for 2-D (on the model's device)."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(model_input(cfg, seismic).to(device))
    pred = logits.argmax(1)
    return (pred[0] if cfg.model == "3d" else pred.permute(1, 0, 2)).cpu().numpy().astype(np.uint8)


def slab(t: torch.Tensor, group, dim: int) -> torch.Tensor:
    """This rank's depth slab of a tensor every rank of the spatial group holds."""
    if group is None:
        return t
    return scatter_spatial(t, dim, group)


def predicted_activation_mb(cfg, spatial: int | None = None) -> float:
    """Activation memory of one cube's forward + loss on one rank (its slab), MB, from a meta-device pass."""
    s = cfg.spatial if spatial is None else spatial
    model = build_model(cfg)
    cd, cx, cy = cfg.cube
    shape = (1, 1, cd // s, cx, cy) if cfg.model == "3d" else (cx, 1, cd, cy)
    return models.activation_bytes(model, shape, device="meta", halo=s > 1) / 2 ** 20


def average_gradients(model, ctx) -> None:
    """Mean of the gradients over the run's ranks once the step's cubes are done (backends allreduce and horovod;
    DDP takes its mean during the step's last backward)."""
    if ctx.world_size == 1 or ctx.backend == "ddp":
        return
    if ctx.backend == "horovod":
        import horovod.torch as hvd     # lazy: Horovod is optional (only this backend needs it)
        handles = [hvd.allreduce_async_(p.grad, op=hvd.Average, name=f"seismic.grad.{i}")
                   for i, p in enumerate(model.parameters()) if p.grad is not None]
        for h in handles:               # started together: Horovod's thread fuses them into few messages
            hvd.synchronize(h)
        return
    data_parallel.average_gradients(model, group=ctx.group)   # one allreduce per tensor (notebook 03)


def no_sync(model, last: bool):
    """DDP's ``no_sync`` for every backward of a step but the last (gradients accumulate locally); nothing to do
    for a model that is not DDP, whose gradients are averaged after the step's cubes."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not last:
        return model.no_sync()
    return contextlib.nullcontext()


def load_cubes(cfg: Config, ctx) -> dict:
    """This data-parallel group's training cubes; the spatial ranks of a group share them (the first makes them)."""
    g, cubes = ctx.grid, None
    for turn in (0, 1):                                   # the group's first rank makes them, the others load
        if (g.coord("mp") == 0) == (turn == 0):
            cubes = data.training_cubes(cfg.n_volumes, cfg.volume, cfg.cube, cfg.cubes_per_volume, cfg.seed,
                                        rank=g.coord("dp"), world_size=ctx.dp)
        if ctx.mp > 1:
            ctx.barrier()
    return cubes


# --------------------------------------------------------------------------- train
def train(cfg: Config, progress_file: str | None = None, halo_exchange=None) -> dict | None:
    """Train the 2-D or 3-D model on synthetic seismic cubes; evaluate on held-out volumes (on every rank).

    ``halo_exchange``: with ``spatial > 1``, the halo exchange ``(x, halo, rank, world, send, recv)`` that the
    spatial convolutions use (notebook 18's exercise, the learner's in lab 2); default: the package's."""
    s = cfg.spatial
    need_mb = preflight(cfg, cfg.ranks or dist.world_size())   # bad options fail before any work, on every rank
    # the run's ranks as a grid: rows of `spatial` neighbouring ranks share a cube, columns are data-parallel
    ctx = training.setup(cfg, mesh=(None, s), progress_file=progress_file)
    if ctx is None:
        return None
    n_dp, dp_rank = ctx.dp, ctx.grid.coord("dp")
    group = ctx.grid.group("mp") if s > 1 else None       # the ranks that split one cube (none: a whole cube)
    cubes = load_cubes(cfg, ctx)
    vols_per_batch = cfg.global_batch // cfg.cubes_per_volume
    n_batches = cfg.n_volumes // vols_per_batch
    if n_batches < 1:
        raise training.ConfigError(f"n_volumes={cfg.n_volumes} is less than one global batch ({vols_per_batch} volumes)")

    torch.manual_seed(cfg.seed)                           # the same initial model on every rank, whatever ran before
    model = ctx.to(build_model(cfg))
    if cfg.model == "3d":
        model.set_spatial(group, halo_exchange)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    ckpt = ctx.checkpointer(CASE, stage=cfg.model, epochs=cfg.epochs)   # results/seismic/ckpt/<run>/<2d|3d>
    start_epoch, state = ckpt.load(model, opt)
    history = list(state.get("history", []))
    net = model                                           # the model itself, for evaluation
    if ctx.backend == "ddp":                              # every rank holds the whole model: average over the run
        model, opt = ctx.wrap(model, opt, over="run")

    voxels = int(np.prod(cfg.cube))
    depth_dim = 2                                         # (batch, C, depth, ...) for both models
    bar = ctx.progress((cfg.epochs - start_epoch) * n_batches, desc=f"seismic {cfg.model}")
    activation_mb, seconds, samples = 0.0, 0.0, 0
    for epoch in range(start_epoch, cfg.epochs):
        ctx.seed_epoch(epoch)
        order = np.random.default_rng([cfg.seed, epoch]).permutation(n_batches)   # same on every rank
        with ctx.timer() as t:
            for b in order:
                block = range(b * vols_per_batch, (b + 1) * vols_per_batch)
                mine = np.flatnonzero(np.isin(cubes["chunk"], [v for v in block if v % n_dp == dp_rank]))
                opt.zero_grad(set_to_none=True)
                loss_sum = torch.zeros((), device=ctx.device)
                for j, i in enumerate(mine):              # one cube (its slab) at a time: memory of one cube
                    # cut the slab on the host, then move only the slab to the device
                    x = ctx.to(slab(model_input(cfg, cubes["seismic"][i]), group, depth_dim))
                    y = ctx.to(slab(model_target(cfg, cubes["labels"][i]), group, 1))
                    with no_sync(model, last=j == len(mine) - 1):   # DDP: forward and backward inside it
                        with memory.SavedTensors(skip=model.parameters()) as mem:
                            loss = F.cross_entropy(model(x), y, reduction="sum") / (voxels * cfg.global_batch)
                        (loss * ctx.world_size).backward()    # the mean over ranks undoes the factor
                    activation_mb = max(activation_mb, mem.mb)
                    loss_sum += loss.detach()
                average_gradients(model, ctx)
                opt.step()
                history.append(ctx.sum(loss_sum.item()))  # the global batch's mean loss
                samples += cfg.global_batch
                bar.update(loss=history[-1], epoch=epoch)
        seconds += t.seconds
        ckpt.save(epoch + 1, model, opt, history=history)
    bar.close()

    result = evaluate(net, cfg, ctx, cubes)
    result.update(history=history, seconds=ctx.max(seconds), samples=samples, world_size=ctx.world_size,
                  spatial=s, model=cfg.model, cube=list(cfg.cube), device=str(ctx.device),
                  activation_mb=ctx.max(activation_mb), predicted_activation_mb=need_mb,
                  memory_budget_mb=cfg.memory_budget_mb)
    ctx.write_result(CASE, {k: v for k, v in result.items() if k != "example"}, name=f"{cfg.run_name}-{cfg.model}")
    return result


# --------------------------------------------------------------------------- evaluate
def evaluate(model, cfg, ctx, cubes) -> dict:
    """Scores on the held-out volumes (sharded over all ranks, reduced exactly) and the majority baseline."""
    model.set_spatial(None) if cfg.model == "3d" else None   # evaluation needs no saved activations
    model.eval()
    test = data.test_volumes(cfg.n_test, cfg.volume, seed=cfg.seed + 10_000, rank=ctx.rank,
                             world_size=ctx.world_size)
    n = data.N_FACIES
    # majority class of the training data, counted over every data-parallel group's cubes (once per group)
    counts = np.bincount(cubes["labels"].ravel(), minlength=n) if ctx.grid.coord("mp") == 0 else np.zeros(n)
    majority = int(np.argmax(ctx.sum(counts)))
    cm = np.zeros((n, n), np.int64)
    cm_base = np.zeros((n, n), np.int64)
    changes = np.zeros(3)                                 # label changes between inlines: pred, truth, count
    example = None
    for seis, lab in zip(test["seismic"], test["labels"]):
        pred = predict_volume(model, cfg, seis)
        cm += metrics.confusion_matrix(pred, lab, n)
        cm_base += metrics.confusion_matrix(np.full_like(lab, majority), lab, n)
        changes += [(pred[:, 1:] != pred[:, :-1]).sum(), (lab[:, 1:] != lab[:, :-1]).sum(), lab[:, 1:].size]
        if example is None and ctx.is_root and cfg.return_example:
            example = {"seismic": seis, "labels": lab, "pred": pred}
    cm = ctx.sum(cm).astype(np.int64)                     # sufficient statistics, never means
    cm_base = ctx.sum(cm_base).astype(np.int64)
    changes = ctx.sum(changes)
    model.train()
    return {"scores": metrics.segmentation_scores(cm), "baseline": metrics.segmentation_scores(cm_base),
            "majority_class": majority, "confusion": cm.tolist(),
            "section_changes_pred": float(changes[0] / changes[2]),
            "section_changes_true": float(changes[1] / changes[2]), "example": example}


# --------------------------------------------------------------------------- command line
def summary(res: dict) -> dict:
    """What the command line prints (rank 0): the scores against the majority class, time and memory."""
    keys = ("model", "spatial", "world_size", "device", "cube", "seconds", "activation_mb")
    return {**{k: res[k] for k in keys}, "scores": res["scores"], "baseline": res["baseline"]}


# --------------------------------------------------------------------------- the memory wall, in numbers
def memory_curve(cfg, edges, spatial: int = 1) -> list[dict]:
    """Activation MB per rank of one cube ``(depth, e, e)`` for each lateral edge ``e`` (meta device: instant).

    ``depth`` is the training cube's (``cfg.cube[0]``); with ``spatial`` ranks each holds ``depth/spatial``.
    """
    model = models.cube_model(cfg.width, cfg.levels, data.N_FACIES)
    d = cfg.cube[0]
    rows = []
    for e in edges:
        mb = models.activation_bytes(model, (1, 1, d // spatial, e, e), device="meta", halo=spatial > 1) / 2 ** 20
        rows.append({"cube": (d, int(e), int(e)), "edge": int(e), "voxels": d * int(e) ** 2, "activation_mb": mb})
    return rows


def largest_fitting(rows: list[dict], budget_mb: float) -> int | None:
    """The largest cube edge of ``rows`` whose activations fit ``budget_mb`` (None if none does)."""
    fits = [r["edge"] for r in rows if r["activation_mb"] <= budget_mb]
    return max(fits) if fits else None


# --------------------------------------------------------------------------- pictures
FACIES_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]


def _label_cmap():
    from matplotlib.colors import ListedColormap
    return ListedColormap(FACIES_COLORS)


def plot_volume(vol: dict, x: int | None = None, y: int | None = None, z: int | None = None):
    """Seismic (top) and facies (bottom): an inline (fixed x), a crossline (fixed y) and a depth slice."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    d, nx, ny = vol["labels"].shape
    x, y, z = nx // 2 if x is None else x, ny // 2 if y is None else y, d // 3 if z is None else z
    cuts = [("inline x=%d (depth, y)" % x, np.s_[:, x, :]), ("crossline y=%d (depth, x)" % y, np.s_[:, :, y]),
            ("depth slice z=%d (x, y)" % z, np.s_[z, :, :])]
    fig, ax = plt.subplots(2, 3, figsize=(9, 5))
    for j, (title, sl) in enumerate(cuts):
        ax[0, j].imshow(vol["seismic"][sl], cmap="gray", aspect="auto")
        ax[0, j].set_title(title, fontsize=9)
        ax[1, j].imshow(vol["labels"][sl], cmap=_label_cmap(), vmin=0, vmax=data.N_FACIES - 1,
                        interpolation="nearest", aspect="auto")
    for a in ax.ravel():
        a.set_xticks([]), a.set_yticks([])
    ax[0, 0].set_ylabel("seismic"), ax[1, 0].set_ylabel("facies")
    fig.legend([Patch(color=c) for c in FACIES_COLORS], data.FACIES, loc="lower center", ncol=6, fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def plot_memory(rows: list[dict], budget_mb: float, split_rows: list[dict] | None = None, split: int = 2):
    """Activation memory per rank against the cube edge, with the per-rank budget."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(4.8, 3.4))
    c = [r["edge"] for r in rows]
    ax.loglog(c, [r["activation_mb"] for r in rows], "o-", label="one rank")
    if split_rows:
        ax.loglog([r["edge"] for r in split_rows], [r["activation_mb"] for r in split_rows], "s--",
                  label=f"spatial, {split} ranks")
    ax.axhline(budget_mb, color="k", lw=1, ls=":", label=f"budget {budget_mb:g} MB")
    ax.set_xlabel(f"lateral edge e of a ({rows[0]['cube'][0]}, e, e) cube"), ax.set_ylabel("activations per rank (MB)")
    ax.set_xticks(c), ax.set_xticklabels(c), ax.minorticks_off()
    ax.legend(fontsize=8), ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_stitching(truth: np.ndarray, preds: dict, y: int | None = None):
    """A crossline (depth, x) at fixed y, perpendicular to the 2-D model's inline sections."""
    import matplotlib.pyplot as plt
    y = truth.shape[2] // 2 if y is None else y
    panels = [("ground truth", truth)] + list(preds.items())
    fig, ax = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3))
    for a, (name, lab) in zip(ax, panels):
        a.imshow(lab[:, :, y], cmap=_label_cmap(), vmin=0, vmax=data.N_FACIES - 1, interpolation="nearest",
                 aspect="auto")
        a.set_title(f"{name}\nchanges between inlines: {data.label_changes_between_sections(lab):.1%}",
                    fontsize=9)
        a.set_xlabel("x (inline number)"), a.set_yticks([])
    ax[0].set_ylabel("depth")
    fig.tight_layout()
    return fig


def scores_table(rows: dict) -> str:
    """Rows of segmentation scores as a text table."""
    keys = ("pixel_acc", "mean_class_acc", "mean_iou", "fw_iou")
    lines = [f"{'':<28}" + "".join(f"{k:>15}" for k in keys)]
    for name, sc in rows.items():
        lines.append(f"{name:<28}" + "".join(f"{sc[k]:>15.3f}" if k in sc else f"{'-':>15}" for k in keys))
    return "\n".join(lines)


# published F3 Netherlands numbers (real data), for reference
F3_REFERENCE = {
    "F3 section-based (Alaudah et al. 2019)": {"pixel_acc": 0.905, "fw_iou": 0.817},
    "F3 HRNet (published)": {"pixel_acc": 0.928, "fw_iou": 0.871},
}
