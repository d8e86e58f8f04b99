"""Lab 1: in-field maize plant instance segmentation and anomaly detection, data-parallel.

``train(cfg)`` runs two stages on every rank (the same code for the notebook, the CLI and the tests):

1. **segmentation** -- a small U-Net (:mod:`ddlcourse.models.maize`) learns the plant mask, the plant
   centres and the offsets to them; instances come from grouping; scored by mask AP50 / AP and the mean
   IoU of matched instances (:class:`ddlcourse.metrics.InstanceStats`), reduced over all ranks;
2. **anomaly** -- a convolutional autoencoder learns crops of *normal* plants only; a plant's
   reconstruction error is its anomaly score, scored by AUROC and AP over all ranks.

Data parallelism with Horovod (this lab's default backend) or DDP, on the same code path
(:meth:`ddlcourse.training.RunContext.wrap`), optionally with the course's SyncBatchNorm. Config, command
line, device, timers, checkpoints and results come from the course's case skeleton (:mod:`ddlcourse.training`).

**Same global batch on any number of ranks.** Each step takes ``per_chunk`` images from *every* data
chunk (each chunk shuffled by its own seed ``[seed, epoch, chunk]``), and rank r owns chunks r, r+N, ...,
so the global batch of step s is the same set of images on 1, 2 or 4 ranks. With SyncBatchNorm the loss
trajectory is then the serial one up to floating-point rounding; with per-rank BatchNorm it is not.

Command line (horovod is this lab's default in notebooks; the course CLI's ``--backend`` defaults to ddp)::

    mpiexec -n 4 python -m ddlcourse run maize --scale smoke --backend horovod [--fresh] [seg_epochs=2 syncbn=false]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ddlcourse import integrity, metrics, training
from ddlcourse.training import setting
from ddlcourse.data import maize as data
from ddlcourse.metrics import InstanceStats
from ddlcourse.models.maize import CropAutoencoder, UNet, group_instances, seg_loss
from ddlcourse.parallel.data_parallel import unwrap
from ddlcourse.parallel.syncbn import convert_sync_batchnorm

CASE = "maize"
STAGES = ("seg", "ae")


@dataclass(kw_only=True)
class Config(training.CaseConfig):
    """The ``lab_maize`` sizes at a scale, and this lab's run options."""

    CASE: ClassVar[str] = CASE
    SECTION: ClassVar[str] = "lab_maize"
    # data: field tiles of size x size px; n_train tiles in chunks of chunk_size
    size: int = setting(min=1, help="pixels on a side of a field tile")
    n_rows: int = setting(min=1, help="crop rows in a tile")
    n_slots: int = setting(min=1, help="plant positions along a row")
    n_train: int = setting(min=1, help="training tiles")
    chunk_size: int = setting(min=1, help="tiles per chunk (the unit a rank owns)")
    n_val: int = setting(min=1, help="validation tiles")
    val_chunk_size: int = setting(min=1, help="validation tiles per chunk")
    per_chunk: int = setting(min=1, help="tiles of each chunk in a step: global batch = chunks * per_chunk")
    # models and optimisation
    seg_epochs: int = setting(min=1, help="epochs of the segmentation U-Net")
    ae_epochs: int = setting(min=1, help="epochs of the anomaly autoencoder")
    width: int = setting(min=1, help="channels of the U-Net's first level")
    depth: int = setting(min=1, help="levels of the U-Net")
    ae_width: int = setting(min=1, help="channels of the autoencoder's first layer")
    latent: int = setting(min=1, help="size of the autoencoder's code")
    crop: int = setting(min=1, help="pixels on a side of the plant crops the autoencoder sees")
    lr: float = setting(above=0, help="Adam's learning rate (segmentation)")
    ae_lr: float = setting(above=0, help="Adam's learning rate (autoencoder)")
    # run options
    backend: str = setting("horovod", help="how gradients are averaged: allreduce, ddp, horovod")
    syncbn: bool = setting(True, help="SyncBatchNorm: BatchNorm statistics of the global batch")
    stages: str = setting("seg,ae", help="what to train: seg, ae or seg,ae")
    field_chunks: int | None = setting(None, min=1, help="train on the first field_chunks chunks only (weak "
                                                         "scaling); none: all of them")
    eval: bool = setting(True, help="evaluate on the validation tiles after training")

    def validate(self) -> None:
        super().validate()
        for s in self.stages.split(","):
            if s not in STAGES:
                raise training.ConfigError(f"unknown stage {s!r} in stages={self.stages!r}; use seg, ae or seg,ae")
        if self.n_train % self.chunk_size or self.chunk_size % self.per_chunk:
            raise training.ConfigError(f"n_train={self.n_train} must be a multiple of chunk_size={self.chunk_size}, "
                                       f"and chunk_size a multiple of per_chunk={self.per_chunk}")
        if self.field_chunks is not None and not 1 <= self.field_chunks <= self.n_train // self.chunk_size:
            raise training.ConfigError(f"field_chunks={self.field_chunks} must lie in [1, "
                                       f"{self.n_train // self.chunk_size}] (the chunks of the training field)")

    @property
    def stage_list(self) -> list[str]:
        return self.stages.split(",")


# =========================================================================== data
def train_settings(cfg: Config) -> dict:
    return data.settings(cfg.n_train, cfg.chunk_size, cfg.seed, cfg.size, cfg.n_rows, cfg.n_slots)


def field_of(arrays: dict, field_chunks: int | None, n_chunks: int) -> tuple[dict, int]:
    """Keep only the first ``field_chunks`` chunks of the field (weak scaling grows the field with the ranks)."""
    if field_chunks is None:
        return arrays, n_chunks
    if not 1 <= field_chunks <= n_chunks:
        raise ValueError(f"field_chunks must lie in [1, {n_chunks}] (the chunks of the training field), got {field_chunks}")
    keep = arrays["chunk"] < field_chunks
    if not keep.any():
        raise ValueError(f"this rank has no chunk among the first {field_chunks}: use at most {field_chunks} ranks")
    return {k: v[keep] for k, v in arrays.items()}, int(field_chunks)


def val_settings(cfg: Config) -> dict:
    return data.settings(cfg.n_val, cfg.val_chunk_size, cfg.seed + 10_000, cfg.size, cfg.n_rows, cfg.n_slots)


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """(n, H, W, 3) uint8 -> (n, 3, H, W) float in [0, 1]."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255)


def prepare(arrays: dict, crop: int) -> dict:
    """Tensors for training: images, targets (n, 4, H, W) and per-image plant crops (n, R, 3, crop, crop)."""
    n, R = arrays["plants"].shape[:2]
    crops = np.zeros((n, R, crop, crop, 3), np.uint8)
    for i in range(n):
        c, _ = data.crops(arrays["image"][i:i + 1], arrays["plants"][i:i + 1], crop)
        crops[i, :len(c)] = c                                   # valid records come first in each image
    recs = arrays["plants"]
    return {
        "x": to_tensor(arrays["image"]),
        "y": torch.from_numpy(np.stack([data.targets(m) for m in arrays["instances"]])),
        "crops": to_tensor(crops.reshape(n * R, crop, crop, 3)).view(n, R, 3, crop, crop),
        "normal": torch.from_numpy((recs[..., 5] > 0) & (recs[..., 4] == 0)).float(),   # (n, R)
        "chunk": arrays["chunk"],
    }


def global_batches(chunk_ids: np.ndarray, per_chunk: int, seed: int, epoch: int) -> list[np.ndarray]:
    """This rank's micro-batches (local indices) of one epoch: step s takes ``per_chunk`` images of every chunk.

    Each chunk is shuffled by its own seed, so the union over ranks of step s is the same for any world size.
    """
    by_chunk = [np.nonzero(chunk_ids == c)[0] for c in np.unique(chunk_ids)]
    sizes = {len(ix) for ix in by_chunk}
    if len(sizes) != 1 or next(iter(sizes)) % per_chunk:
        raise ValueError(f"every chunk must hold the same number of images, a multiple of per_chunk={per_chunk}; "
                         f"got chunk sizes {sorted(sizes)}: make n_train a multiple of chunk_size")
    perms = [ix[np.random.default_rng([seed, epoch, int(c)]).permutation(len(ix))]
             for ix, c in zip(by_chunk, np.unique(chunk_ids))]
    steps = len(by_chunk[0]) // per_chunk
    return [np.concatenate([p[s * per_chunk:(s + 1) * per_chunk] for p in perms]) for s in range(steps)]


# =========================================================================== baselines
def excess_green(images: np.ndarray) -> np.ndarray:
    """ExG = 2g - r - b (Woebbecke et al. 1995), the classic vegetation index; (n, H, W)."""
    x = images.astype(np.float32) / 255
    return 2 * x[..., 1] - x[..., 0] - x[..., 2]


def baseline_instances(image: np.ndarray, mode: str = "components", thr: float = 0.1):
    """Trivial instance segmentation of one image: threshold ExG, then one instance per connected
    component (``components``), or all green pixels as one plant (``one``). Score = area."""
    from scipy import ndimage
    green = excess_green(image[None])[0] > thr
    if mode == "one":
        ids = green.astype(np.int64)
    else:
        ids, _ = ndimage.label(green)
    area = np.bincount(ids.ravel())[1:]
    return ids, area.astype(float)


def green_area(crops: torch.Tensor, thr: float = 0.1) -> np.ndarray:
    """Green pixel count of each (3, h, w) crop in [0, 1]."""
    c = crops.detach().cpu().numpy()
    return ((2 * c[:, 1] - c[:, 0] - c[:, 2]) > thr).sum((1, 2)).astype(float)


# =========================================================================== training
def _sync_buffers(model, ctx) -> None:
    """Average BatchNorm running statistics over ranks (per-rank BN with Horovod lets them drift apart)."""
    if ctx.world_size == 1:
        return
    with torch.no_grad():
        for b in model.buffers():
            if b.dtype.is_floating_point:
                b.copy_(torch.from_numpy(ctx.mean(ctx.numpy(b))).to(b.dtype))


def _wrap(model, opt, ctx, ddp):
    """``ctx.wrap`` (the run's backend), or, when ``ddp`` is given, that data-parallel class (the learner's MyDDP
    of notebook 05, which needs ``finish_gradient_synchronization()`` before each step)."""
    if ddp is None or ctx.world_size == 1:
        return ctx.wrap(model, opt)
    return ddp(model, group=ctx.group), opt


def _finish(model) -> None:
    if hasattr(model, "finish_gradient_synchronization"):
        model.finish_gradient_synchronization()


def train_segmentation(cfg: Config, ctx, tr, bar, ddp=None) -> tuple[torch.nn.Module, dict]:
    model = UNet(cfg.width, cfg.depth)
    if cfg.syncbn and ctx.world_size > 1:
        model = convert_sync_batchnorm(model, group=ctx.group)           # NEW: statistics of the global batch
    model = ctx.to(model)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    ck = ctx.checkpointer(CASE, "segmentation", epochs=cfg.seg_epochs)
    start, hist = ck.load(model, opt)                                    # resume before wrapping
    hist = {"loss": list(hist.get("loss", [])), "seconds": float(hist.get("seconds", 0.0)),
            "samples": int(hist.get("samples", 0))}
    model, opt = _wrap(model, opt, ctx, ddp)                           # NEW: broadcast + average gradients
    for epoch in range(start, cfg.seg_epochs):
        model.train()
        for idx in global_batches(tr["chunk"], cfg.per_chunk, cfg.seed, epoch):   # NEW: my share of each step
            with ctx.timer() as t:                                       # synchronised on a GPU
                x, y = ctx.to((tr["x"][idx], tr["y"][idx]))              # (micro_batch, 3|4, H, W)
                opt.zero_grad()
                loss = seg_loss(model(x), y)
                loss.backward()
                _finish(model)                                   # NEW: a learner's MyDDP waits here
                opt.step()
            hist["seconds"] += t.seconds
            hist["samples"] += len(idx) * ctx.world_size
            hist["loss"].append(ctx.mean(loss.item()))                   # mean over the global batch
            bar.update(loss=hist["loss"][-1])
        _sync_buffers(_unwrap(model), ctx)
        ck.save(epoch + 1, _unwrap(model), opt, **hist)
    return _unwrap(model), hist


def train_autoencoder(cfg: Config, ctx, tr, bar, ddp=None) -> tuple[torch.nn.Module, dict]:
    ae = ctx.to(CropAutoencoder(cfg.latent, cfg.ae_width, cfg.crop))
    opt = torch.optim.Adam(ae.parameters(), lr=cfg.ae_lr)
    ck = ctx.checkpointer(CASE, "autoencoder", epochs=cfg.ae_epochs)
    start, hist = ck.load(ae, opt)
    hist = {"loss": list(hist.get("loss", [])), "seconds": float(hist.get("seconds", 0.0))}
    ae, opt = _wrap(ae, opt, ctx, ddp)
    for epoch in range(start, cfg.ae_epochs):
        for idx in global_batches(tr["chunk"], cfg.per_chunk, cfg.seed + 1, epoch):
            with ctx.timer() as t:
                # (micro_batch * R, 3, crop, crop) crops; w: 1 for normal plants, 0 otherwise
                c, w = ctx.to((tr["crops"][idx].flatten(0, 1), tr["normal"][idx].flatten()))
                n_global = ctx.sum(float(w.sum()))                       # normal crops in the global batch
                opt.zero_grad()
                err = ((ae(c) - c) ** 2).mean((1, 2, 3))                  # (crops,)
                # gradients are *averaged* over ranks, so scale by world_size: the result is the global mean
                loss = (err * w).sum() * ctx.world_size / max(n_global, 1.0)
                loss.backward()
                _finish(ae)
                opt.step()
            hist["seconds"] += t.seconds
            hist["loss"].append(ctx.mean(loss.item()))
            bar.update(loss=hist["loss"][-1])
        ck.save(epoch + 1, _unwrap(ae), opt, **hist)
    return _unwrap(ae), hist


def _unwrap(model):
    model = unwrap(model)
    return model.module if hasattr(model, "finish_gradient_synchronization") else model


# =========================================================================== evaluation
@torch.no_grad()
def evaluate_segmentation(model, va, ctx, batch: int = 16) -> tuple[dict, list]:
    model.eval()
    st, base_cc, base_one = InstanceStats(), InstanceStats(), InstanceStats()
    preds = []
    for i in range(0, len(va["x"]), batch):
        out = model(ctx.to(va["x"][i:i + batch])).cpu()            # (batch, 4, H, W) back on the CPU
        for k in range(out.shape[0]):
            ids, scores = group_instances(out[k])
            gt = va["instances"][i + k]
            st.add(ids.numpy(), scores.numpy(), gt)
            base_cc.add(*baseline_instances(va["image"][i + k], "components"), gt)
            base_one.add(*baseline_instances(va["image"][i + k], "one"), gt)
            preds.append(ids.numpy().astype(np.int16))
    res = st.result(ctx.comm)
    res["baseline_components"] = base_cc.result(ctx.comm)
    res["baseline_one_plant"] = base_one.result(ctx.comm)
    return res, preds


@torch.no_grad()
def evaluate_anomaly(ae, tr, va, ctx, seed: int) -> dict:
    ae.eval()
    crops, recs = data.crops(va["image"], va["plants"], va["crop"])
    x = ctx.to(to_tensor(crops))
    err = ((ae(x) - x) ** 2).mean((1, 2, 3)).cpu().numpy() if len(x) else np.zeros(0)
    z = ae.encode(x).cpu().numpy() if len(x) else np.zeros((0, ae.encoder[-1].out_features))
    kind = recs[:, 4].astype(int)
    y = kind > 0
    # trivial scores: a random number, and how far the green (leaf) area is from that of normal plants
    normal_area = metrics.global_mean(
        green_area(tr["crops"].flatten(0, 1)[tr["normal"].flatten() > 0]), ctx.comm)
    leaf_area = np.abs(green_area(x.cpu()) - normal_area)
    rnd = np.random.default_rng([seed, ctx.rank]).random(len(err))
    res = {"auroc": metrics.roc_auc(err, y, ctx.comm), "ap_anomaly": metrics.average_precision(err, y, ctx.comm),
           "auroc_leaf_area": metrics.roc_auc(leaf_area, y, ctx.comm),
           "ap_leaf_area": metrics.average_precision(leaf_area, y, ctx.comm),
           "auroc_random": metrics.roc_auc(rnd, y, ctx.comm),
           "ap_random": metrics.average_precision(rnd, y, ctx.comm),
           "anomaly_rate": metrics.global_mean(y, ctx.comm)}
    # AUROC of each anomaly type against the normal plants
    all_err, all_kind = metrics.allgather_concat(err, ctx.comm), metrics.allgather_concat(kind, ctx.comm)
    res["auroc_by_type"] = {
        data.ANOMALIES[t]: metrics.roc_auc(all_err[(all_kind == t) | (all_kind == 0)],
                                           all_kind[(all_kind == t) | (all_kind == 0)] == t)
        for t in range(1, len(data.ANOMALIES)) if (all_kind == t).any()}
    zs = ctx.comm.gather(z, root=0)
    if ctx.is_root:
        res["latent"] = np.concatenate(zs)
        res["latent_kind"], res["latent_score"] = all_kind, all_err
        res["example_crops"] = crops[:24]
        res["example_recon"] = (ae(x[:24]).permute(0, 2, 3, 1).cpu().numpy() * 255).astype(np.uint8)
        res["example_kind"] = kind[:24]
    return res


# =========================================================================== the entry point
def train(cfg: Config, progress_file: str | None = None, ddp=None) -> dict | None:
    """Train and evaluate on this rank's shard; every rank returns the same metrics (rank 0 also pictures).

    ``ddp``: a data-parallel class to wrap the models with in place of the backend's (the learner's MyDDP of
    notebook 05: ``ddp(model, group=...)``, ``finish_gradient_synchronization()`` before each step).

    Rank 0 writes the plain numbers to ``results/maize/result-<run_name>.json``.
    """
    ctx = training.setup(cfg, progress_file=progress_file)   # NEW: MPI, torch.distributed, Horovod (cfg.backend)
    if ctx is None:
        return None
    stages = cfg.stage_list
    t_start = ctx.now()
    s_tr = train_settings(cfg)
    tr_arr = data.load(s_tr, ctx.rank, ctx.world_size)              # NEW: this rank's chunks only
    tr_arr, n_chunks = field_of(tr_arr, cfg.field_chunks, -(-s_tr["n_items"] // s_tr["chunk_size"]))
    if n_chunks % ctx.world_size:
        raise ValueError(f"{n_chunks} data chunks do not split evenly over {ctx.world_size} ranks; "
                         "use a number of ranks that divides the number of chunks")
    tr = prepare(tr_arr, cfg.crop)                                       # CPU tensors; batches go to ctx.device
    steps = s_tr["chunk_size"] // cfg.per_chunk
    total = steps * ((cfg.seg_epochs if "seg" in stages else 0) + (cfg.ae_epochs if "ae" in stages else 0))
    bar = ctx.progress(total, desc=f"maize {cfg.backend} x{ctx.world_size}")
    out = {"world_size": ctx.world_size, "backend": cfg.backend, "syncbn": cfg.syncbn,
           "global_batch": n_chunks * cfg.per_chunk, "micro_batch": n_chunks * cfg.per_chunk // ctx.world_size,
           "field_images": n_chunks * s_tr["chunk_size"], "steps_per_epoch": steps, "run_name": cfg.run_name}
    va = None
    if cfg.eval:
        va_arr = data.load(val_settings(cfg), ctx.rank, ctx.world_size)
        va = {"x": to_tensor(va_arr["image"]), "image": va_arr["image"], "instances": va_arr["instances"],
              "plants": va_arr["plants"], "crop": cfg.crop}
    if "seg" in stages:
        model, hist = train_segmentation(cfg, ctx, tr, bar, ddp)
        out.update(loss=hist["loss"], seconds=hist["seconds"], samples=hist["samples"])
        out["throughput"] = hist["samples"] / max(hist["seconds"], 1e-9)
        if va is not None:
            seg, preds = evaluate_segmentation(model, va, ctx)
            out.update(seg)
            if ctx.is_root:
                out["examples"] = {"image": va["image"][:4], "truth": va["instances"][:4], "pred": np.stack(preds[:4])}
    if "ae" in stages:
        ae, hist = train_autoencoder(cfg, ctx, tr, bar, ddp)
        out.update(ae_loss=hist["loss"], ae_seconds=hist["seconds"])
        if va is not None:
            out.update(evaluate_anomaly(ae, tr, va, ctx, cfg.seed))
    bar.close()
    out["total_seconds"] = ctx.now() - t_start
    ctx.write_result(CASE, summary(out))
    return out


def summary(res: dict) -> dict:
    """The plain numbers of a result (no arrays, no per-step lists): for printing and the result file."""
    keep = training.summary(res)
    for k in ("loss", "ae_loss"):
        if res.get(k):
            keep[f"final_{k}"] = res[k][-1]
    return keep


# =========================================================================== pictures
def show_samples(arrays: dict, n: int = 4, axes=None):
    """Images with their plant records (anomalies named) above their instance masks."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(2, n, figsize=(2.2 * n, 4.6))
    for i in range(n):
        axes[0, i].imshow(arrays["image"][i])
        for r in arrays["plants"][i]:
            if r[5] > 0 and r[4] > 0:
                axes[0, i].annotate(data.ANOMALIES[int(r[4])], (r[0], r[1]), color="white", fontsize=7,
                                    ha="center", bbox=dict(fc="black", alpha=0.5, pad=1, lw=0))
        axes[1, i].imshow(_id_colours(arrays["instances"][i]), interpolation="nearest")
        for a in axes[:, i]:
            a.set_xticks([]), a.set_yticks([])
    axes[0, 0].set_ylabel("image")
    axes[1, 0].set_ylabel("instances")
    return axes


def _id_colours(ids: np.ndarray) -> np.ndarray:
    """A random colour per instance id, black background: (H, W, 3)."""
    pal = np.random.default_rng(3).uniform(0.25, 1.0, (int(ids.max()) + 1, 3))
    pal[0] = 0
    return pal[ids.astype(np.int64)]


def show_predictions(res: dict, n: int = 4):
    """Rows: image, true instances, predicted instances (colours are arbitrary per instance)."""
    import matplotlib.pyplot as plt
    ex = res["examples"]
    n = min(n, len(ex["image"]))
    fig, axes = plt.subplots(3, n, figsize=(2.2 * n, 6.6))
    for i in range(n):
        axes[0, i].imshow(ex["image"][i])
        axes[1, i].imshow(_id_colours(ex["truth"][i]), interpolation="nearest")
        axes[2, i].imshow(_id_colours(ex["pred"][i]), interpolation="nearest")
        for a in axes[:, i]:
            a.set_xticks([]), a.set_yticks([])
    for a, name in zip(axes[:, 0], ("image", "truth", "predicted")):
        a.set_ylabel(name)
    fig.tight_layout()
    return fig


def pca_2d(z: np.ndarray) -> np.ndarray:
    """The first two principal components of the rows of ``z`` (n, d) -> (n, 2)."""
    zc = z - z.mean(0)
    _, _, vt = np.linalg.svd(zc, full_matrices=False)
    return zc @ vt[:2].T


def plot_latent(res: dict, ax=None):
    """The autoencoder's latent codes of the validation plants in 2-D (PCA), coloured by anomaly type."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(4.6, 3.8))
    p = pca_2d(res["latent"])
    for t, name in enumerate(data.ANOMALIES):
        m = res["latent_kind"] == t
        if m.any():
            ax.scatter(p[m, 0], p[m, 1], s=10 if t == 0 else 22, alpha=0.5 if t == 0 else 0.9, label=name,
                       marker="." if t == 0 else "o")
    ax.set_xlabel("PC 1")
    ax.set_ylabel("PC 2")
    ax.set_title("autoencoder latent space")
    ax.legend(fontsize=7, markerscale=1.2)
    return ax


def show_reconstructions(res: dict, n: int = 8):
    """Validation crops (top) and the autoencoder's reconstructions (bottom), titled by anomaly type."""
    import matplotlib.pyplot as plt
    kinds = res["example_kind"]
    order = np.argsort(kinds == 0, kind="stable")[:n]             # anomalies first, then normal plants
    fig, axes = plt.subplots(2, len(order), figsize=(1.3 * len(order), 2.9))
    for j, i in enumerate(order):
        axes[0, j].imshow(res["example_crops"][i])
        axes[1, j].imshow(res["example_recon"][i])
        axes[0, j].set_title(data.ANOMALIES[int(kinds[i])], fontsize=8)
        for a in axes[:, j]:
            a.set_xticks([]), a.set_yticks([])
    axes[0, 0].set_ylabel("crop")
    axes[1, 0].set_ylabel("decoded")
    fig.tight_layout()
    return fig


# =========================================================================== comparing runs
max_rel_diff = integrity.max_rel_diff            # largest relative difference of two loss trajectories
plot_deviation = integrity.plot_rel_deviation    # |loss - serial loss| / serial loss per step


def seconds_per_step(res: dict) -> float:
    """Mean training time of one segmentation step of a run."""
    return res["seconds"] / len(res["loss"])
