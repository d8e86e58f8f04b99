"""Lab 1: in-field maize plant instance segmentation and anomaly detection, data-parallel.

``train(cfg)`` runs two stages on every rank (the same code for the notebook, the CLI and the tests):

1. **segmentation** -- a small U-Net (:mod:`ddlcourse.models.maize`) learns the plant mask, the plant
   centres and the offsets to them; instances come from grouping; scored by mask AP50 / AP and the mean
   IoU of matched instances, reduced over all ranks;
2. **anomaly** -- a convolutional autoencoder learns crops of *normal* plants only; a plant's
   reconstruction error is its anomaly score, scored by AUROC and AP over all ranks.

Data parallelism with Horovod (this lab's default backend) or DDP, on the same code path
(:meth:`ddlcourse.training.RunContext.wrap`), optionally with the course's SyncBatchNorm.

**Same global batch on any number of ranks.** Each step takes ``per_chunk`` images from *every* data
chunk (each chunk shuffled by its own seed ``[seed, epoch, chunk]``), and rank r owns chunks r, r+N, ...,
so the global batch of step s is the same set of images on 1, 2 or 4 ranks. With SyncBatchNorm the loss
trajectory is then the serial one up to floating-point rounding; with per-rank BatchNorm it is not.

Command line (horovod is this lab's default in notebooks; the course CLI's ``--backend`` defaults to ddp)::

    mpiexec -n 4 python -m ddlcourse run maize --scale smoke --backend horovod [--seg-epochs 2] [--no-resume]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

from ddlcourse import config, metrics, training
from ddlcourse.data import maize as data
from ddlcourse.models.maize import CropAutoencoder, UNet, group_instances, seg_loss

CASE = "maize"
DEFAULTS = dict(backend="horovod", ranks=None, seed=0, syncbn=True, run_name="default", resume=True,
                stages="seg,ae", field_chunks=None, eval=True)


def make_cfg(scale: str | None = None, **overrides) -> SimpleNamespace:
    """The run settings: the ``lab_maize`` sizes at ``scale`` plus :data:`DEFAULTS`, then ``overrides``.

    ``field_chunks``: train on the first ``field_chunks`` chunks only (the field size; weak scaling).
    """
    sizes = vars(config.sizes("lab_maize", scale))
    cfg = {**sizes, **DEFAULTS}
    unknown = set(overrides) - set(cfg)
    if unknown:
        raise ValueError(f"unknown maize setting(s) {sorted(unknown)}; known: {sorted(cfg)}")
    cfg.update(overrides)
    if cfg["backend"] not in ("ddp", "horovod"):
        raise ValueError(f"unknown backend {cfg['backend']!r}; choose ddp or horovod")
    for s in str(cfg["stages"]).split(","):
        if s not in ("seg", "ae"):
            raise ValueError(f"unknown stage {s!r} in stages={cfg['stages']!r}; use seg, ae or seg,ae")
    return SimpleNamespace(**cfg)


# =========================================================================== data
def train_settings(cfg) -> dict:
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


def val_settings(cfg) -> dict:
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


# =========================================================================== instance metrics
def iou_matrix(pred_ids: np.ndarray, gt_ids: np.ndarray) -> np.ndarray:
    """IoU of every predicted instance (rows) with every true instance (columns) of one image.

    Ids are 1..P and 1..G in (H, W) maps, 0 = background; an id missing from its map gets an all-zero row/column.
    """
    p, g = pred_ids.ravel().astype(np.int64), gt_ids.ravel().astype(np.int64)
    P, G = int(p.max(initial=0)), int(g.max(initial=0))
    inter = np.bincount(p * (G + 1) + g, minlength=(P + 1) * (G + 1)).reshape(P + 1, G + 1)[1:, 1:]
    area_p = np.bincount(p, minlength=P + 1)[1:]
    area_g = np.bincount(g, minlength=G + 1)[1:]
    union = area_p[:, None] + area_g[None, :] - inter
    return np.divide(inter, union, out=np.zeros(inter.shape), where=union > 0)


def match(iou: np.ndarray, scores: np.ndarray, thr: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Greedy matching as in COCO: predictions in decreasing score take the free true instance of highest IoU >= thr.

    Returns ``(tp (P,) bool, matched_iou (P,))`` (0 where unmatched).
    """
    P, G = iou.shape
    tp, miou = np.zeros(P, bool), np.zeros(P)
    free = np.ones(G, bool)
    for i in np.argsort(-np.asarray(scores), kind="mergesort"):
        if G == 0:
            break
        cand = np.where(free, iou[i], -1.0)
        j = int(cand.argmax())
        if cand[j] >= thr:
            tp[i], miou[i], free[j] = True, iou[i, j], False
    return tp, miou


def average_precision_from_matches(scores, tp, n_gt: int) -> float:
    """Area under the precision-recall curve with the precision envelope (COCO / VOC 2010+ style, all points).

    ``scores``, ``tp``: every prediction of the data set; ``n_gt``: the number of true instances.
    """
    if n_gt <= 0:
        raise ValueError("AP needs at least one true instance")
    scores, tp = np.asarray(scores, float), np.asarray(tp, bool)
    order = np.argsort(-scores, kind="mergesort")
    hits = tp[order]
    tps, fps = np.cumsum(hits), np.cumsum(~hits)
    recall = np.concatenate([[0.0], tps / n_gt])
    precision = np.concatenate([[1.0], tps / np.maximum(tps + fps, 1)])
    envelope = np.maximum.accumulate(precision[::-1])[::-1]          # best precision at this recall or more
    return float(np.sum((recall[1:] - recall[:-1]) * envelope[1:]))


IOU_THRESHOLDS = np.round(np.arange(0.5, 0.96, 0.05), 2)


class InstanceStats:
    """Per-image match statistics, kept for the whole (sharded) evaluation set, then gathered over ranks."""

    def __init__(self):
        self.scores, self.tp, self.iou, self.n_gt = [], [], [], 0

    def add(self, pred_ids: np.ndarray, scores: np.ndarray, gt_ids: np.ndarray) -> None:
        iou = iou_matrix(pred_ids, gt_ids)
        gt_present = np.bincount(gt_ids.ravel().astype(np.int64))[1:] > 0
        iou = iou[:, gt_present]
        self.n_gt += int(gt_present.sum())
        self.scores.append(np.asarray(scores, float))
        tps, ious = zip(*(match(iou, scores, t) for t in IOU_THRESHOLDS))
        self.tp.append(np.stack(tps, 1))                                # (P, thresholds)
        self.iou.append(ious[0])                                        # IoU of the match at 0.5

    def result(self, comm=None) -> dict:
        """AP50, AP (mean over IoU 0.50:0.95) and mean IoU of instances matched at 0.5, over all ranks."""
        s = np.concatenate(self.scores) if self.scores else np.zeros(0)
        tp = np.concatenate(self.tp) if self.tp else np.zeros((0, len(IOU_THRESHOLDS)), bool)
        iou = np.concatenate(self.iou) if self.iou else np.zeros(0)
        if comm is not None:                                            # every prediction of every rank
            s = np.concatenate(comm.allgather(s))
            tp = np.concatenate(comm.allgather(tp))
            iou = np.concatenate(comm.allgather(iou))
            n_gt = comm.allreduce(self.n_gt)
        else:
            n_gt = self.n_gt
        aps = [average_precision_from_matches(s, tp[:, k], n_gt) for k in range(len(IOU_THRESHOLDS))]
        m = tp[:, 0]
        return {"ap50": aps[0], "ap": float(np.mean(aps)),
                "miou_matched": float(iou[m].mean()) if m.any() else 0.0,
                "recall50": float(m.sum() / n_gt), "n_gt": int(n_gt), "n_pred": int(len(s))}


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
    c = crops.numpy()
    return ((2 * c[:, 1] - c[:, 0] - c[:, 2]) > thr).sum((1, 2)).astype(float)


# =========================================================================== training
def _sync_buffers(model, comm) -> None:
    """Average BatchNorm running statistics over ranks (per-rank BN with Horovod lets them drift apart)."""
    if comm is None or comm.Get_size() == 1:
        return
    with torch.no_grad():
        for b in model.buffers():
            if b.dtype.is_floating_point:
                b.copy_(torch.from_numpy(metrics.allreduce_sum(b, comm) / comm.Get_size()).to(b.dtype))


def _global_mean(x: float, comm) -> float:
    return comm.allreduce(float(x)) / comm.Get_size()


def _ckpt(cfg, ctx, stage: str) -> training.Checkpointer:
    ck = training.Checkpointer(training.results_dir(CASE) / "ckpt" / cfg.run_name / stage, ctx)
    if not cfg.resume:
        ck.clear()
    return ck


def train_segmentation(cfg, ctx, tr, bar) -> tuple[torch.nn.Module, dict]:
    model = UNet(cfg.width, cfg.depth)
    if cfg.syncbn and ctx.world_size > 1:
        from ddlcourse.parallel.syncbn import convert_sync_batchnorm
        model = convert_sync_batchnorm(model, group=ctx.group)           # NEW: statistics of the global batch
    model.to(ctx.device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    ck = _ckpt(cfg, ctx, "seg")
    start, hist = ck.load(model, opt)                                    # resume before wrapping
    hist = {"loss": list(hist.get("loss", [])), "seconds": float(hist.get("seconds", 0.0)),
            "samples": int(hist.get("samples", 0))}
    model, opt = ctx.wrap(model, opt)
    for epoch in range(start, cfg.seg_epochs):
        model.train()
        for idx in global_batches(tr["chunk"], cfg.per_chunk, cfg.seed, epoch):
            t0 = time.perf_counter()
            x, y = tr["x"][idx].to(ctx.device), tr["y"][idx].to(ctx.device)   # (micro_batch, 3|4, H, W)
            opt.zero_grad()
            loss = seg_loss(model(x), y)
            loss.backward()
            opt.step()
            hist["seconds"] += time.perf_counter() - t0
            hist["samples"] += len(idx) * ctx.world_size
            hist["loss"].append(_global_mean(loss.item(), ctx.comm))      # mean over the global batch
            bar.update(loss=hist["loss"][-1])
        _sync_buffers(_unwrap(model), ctx.comm)
        ck.save(epoch + 1, model, opt, **hist)
    return _unwrap(model), hist


def train_autoencoder(cfg, ctx, tr, bar) -> tuple[torch.nn.Module, dict]:
    ae = CropAutoencoder(cfg.latent, cfg.ae_width, cfg.crop).to(ctx.device)
    opt = torch.optim.Adam(ae.parameters(), lr=cfg.ae_lr)
    ck = _ckpt(cfg, ctx, "ae")
    start, hist = ck.load(ae, opt)
    hist = {"loss": list(hist.get("loss", [])), "seconds": float(hist.get("seconds", 0.0))}
    ae, opt = ctx.wrap(ae, opt)
    for epoch in range(start, cfg.ae_epochs):
        for idx in global_batches(tr["chunk"], cfg.per_chunk, cfg.seed + 1, epoch):
            t0 = time.perf_counter()
            c = tr["crops"][idx].flatten(0, 1).to(ctx.device)             # (micro_batch * R, 3, crop, crop)
            w = tr["normal"][idx].flatten().to(ctx.device)                # 1 for normal plants, 0 otherwise
            n_global = ctx.comm.allreduce(float(w.sum()))                 # normal crops in the global batch
            opt.zero_grad()
            err = ((ae(c) - c) ** 2).mean((1, 2, 3))                      # (crops,)
            # gradients are *averaged* over ranks, so scale by world_size: the result is the global mean
            loss = (err * w).sum() * ctx.world_size / max(n_global, 1.0)
            loss.backward()
            opt.step()
            hist["seconds"] += time.perf_counter() - t0
            hist["loss"].append(_global_mean(loss.item(), ctx.comm))
            bar.update(loss=hist["loss"][-1])
        ck.save(epoch + 1, ae, opt, **hist)
    return _unwrap(ae), hist


def _unwrap(model):
    from ddlcourse.parallel.data_parallel import unwrap
    return unwrap(model)


# =========================================================================== evaluation
@torch.no_grad()
def evaluate_segmentation(model, va, ctx, batch: int = 16) -> tuple[dict, list]:
    model.eval()
    st, base_cc, base_one = InstanceStats(), InstanceStats(), InstanceStats()
    preds = []
    for i in range(0, len(va["x"]), batch):
        out = model(va["x"][i:i + batch].to(ctx.device)).cpu()
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
    x = to_tensor(crops).to(ctx.device)
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
def train(cfg, progress_file: str | None = None) -> dict | None:
    """Train and evaluate on this rank's shard; every rank returns the same metrics (rank 0 also pictures)."""
    ctx = training.setup(cfg.backend, ranks=cfg.ranks, seed=cfg.seed, progress_file=progress_file)
    if ctx is None:
        return None
    if cfg.backend == "horovod":
        # dist.init is idempotent: after an earlier ddp run in the same process it does not start Horovod
        import horovod.torch as hvd
        if not hvd.is_initialized():
            hvd.init()
    stages = str(cfg.stages).split(",")
    t_start = time.perf_counter()
    s_tr = train_settings(cfg)
    tr_arr = data.load(s_tr, ctx.rank, ctx.world_size)
    tr_arr, n_chunks = field_of(tr_arr, cfg.field_chunks, -(-s_tr["n_items"] // s_tr["chunk_size"]))
    if n_chunks % ctx.world_size:
        raise ValueError(f"{n_chunks} data chunks do not split evenly over {ctx.world_size} ranks; "
                         "use a number of ranks that divides the number of chunks")
    tr = prepare(tr_arr, cfg.crop)
    steps = s_tr["chunk_size"] // cfg.per_chunk
    total = steps * ((cfg.seg_epochs if "seg" in stages else 0) + (cfg.ae_epochs if "ae" in stages else 0))
    bar = ctx.progress(total, desc=f"maize {cfg.backend} x{ctx.world_size}")
    out = {"world_size": ctx.world_size, "backend": cfg.backend, "syncbn": bool(cfg.syncbn),
           "global_batch": n_chunks * cfg.per_chunk, "micro_batch": n_chunks * cfg.per_chunk // ctx.world_size,
           "field_images": n_chunks * s_tr["chunk_size"], "steps_per_epoch": steps}
    va = None
    if cfg.eval:
        va_arr = data.load(val_settings(cfg), ctx.rank, ctx.world_size)
        va = {"x": to_tensor(va_arr["image"]), "image": va_arr["image"], "instances": va_arr["instances"],
              "plants": va_arr["plants"], "crop": cfg.crop}
    if "seg" in stages:
        model, hist = train_segmentation(cfg, ctx, tr, bar)
        out.update(loss=hist["loss"], seconds=hist["seconds"], samples=hist["samples"])
        out["throughput"] = hist["samples"] / max(hist["seconds"], 1e-9)
        if va is not None:
            seg, preds = evaluate_segmentation(model, va, ctx)
            out.update(seg)
            if ctx.is_root:
                out["examples"] = {"image": va["image"][:4], "truth": va["instances"][:4], "pred": np.stack(preds[:4])}
    if "ae" in stages:
        ae, hist = train_autoencoder(cfg, ctx, tr, bar)
        out.update(ae_loss=hist["loss"], ae_seconds=hist["seconds"])
        if va is not None:
            out.update(evaluate_anomaly(ae, tr, va, ctx, cfg.seed))
    bar.close()
    out["total_seconds"] = time.perf_counter() - t_start
    return out


# =========================================================================== command line
def summary(res: dict) -> dict:
    """The plain numbers of a result (no arrays, no per-step lists): for printing and result.json."""
    keep = {}
    for k, v in res.items():
        if isinstance(v, (int, float, str, bool)):
            keep[k] = v
        elif isinstance(v, dict) and all(isinstance(x, (int, float, str, bool)) for x in v.values()):
            keep[k] = v
    if "loss" in res:
        keep["final_loss"] = res["loss"][-1]
    return keep


def cli(argv: list[str], scale: str | None = None, backend: str = "ddp") -> int:
    """``python -m ddlcourse run maize [--seg-epochs N] [--ae-epochs N] [--no-syncbn] [--resume|--no-resume] ...``"""
    p = argparse.ArgumentParser(prog="python -m ddlcourse run maize")
    p.add_argument("--seg-epochs", type=int, default=None)
    p.add_argument("--ae-epochs", type=int, default=None)
    p.add_argument("--stages", default="seg,ae", help="seg, ae or seg,ae")
    p.add_argument("--ranks", type=int, default=None, help="use only the first N ranks (ddp)")
    p.add_argument("--field-chunks", type=int, default=None, help="field size in data chunks (weak scaling)")
    p.add_argument("--no-syncbn", action="store_true", help="per-rank BatchNorm instead of SyncBatchNorm")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--run-name", default="cli")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        over = dict(backend=backend, ranks=a.ranks, stages=a.stages, field_chunks=a.field_chunks,
                    syncbn=not a.no_syncbn, resume=a.resume, run_name=a.run_name, seed=a.seed)
        if a.seg_epochs is not None:
            over["seg_epochs"] = a.seg_epochs
        if a.ae_epochs is not None:
            over["ae_epochs"] = a.ae_epochs
        for k in ("seg_epochs", "ae_epochs"):
            if over.get(k, 1) < 0:
                raise ValueError(f"--{k.replace('_', '-')} must be >= 0")
        res = train(make_cfg(scale, **over))
    except (ValueError, training.CheckpointError) as e:   # bad settings, data or checkpoint: a clear message
        print(f"maize: error: {e}", file=sys.stderr)
        return 2
    from ddlcourse import dist
    if res is not None and dist.rank() == 0:
        s = summary(res)
        print(json.dumps(s, indent=1))
        (training.results_dir(CASE) / "result.json").write_text(json.dumps(s, indent=1))
    return 0


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
def max_rel_diff(a, b) -> float:
    """Largest relative difference between two loss trajectories over their common steps."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = min(len(a), len(b))
    if n == 0:
        raise ValueError("no common steps to compare")
    return float(np.max(np.abs(a[:n] - b[:n]) / np.abs(b[:n])))


def seconds_per_step(res: dict) -> float:
    """Mean training time of one segmentation step of a run."""
    return res["seconds"] / len(res["loss"])


def plot_deviation(reference, runs: dict, ax=None):
    """|loss - serial loss| / serial loss per step, one line per run (log scale)."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(4.6, 3.2))
    ref = np.asarray(reference, float)
    for label, loss in runs.items():
        n = min(len(ref), len(loss))
        ax.semilogy(np.abs(np.asarray(loss[:n]) - ref[:n]) / ref[:n] + 1e-9, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("relative difference to 1 rank")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax
