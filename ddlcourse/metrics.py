"""Metrics computed correctly across ranks.

The rule: reduce the *sufficient statistics* (a confusion matrix, sums and counts), never average per-rank
metrics. Averaging rank 0's IoU with rank 1's is wrong whenever the shards differ in size or content; a
summed confusion matrix gives exactly the metric of the whole data set. Ranking metrics (AUROC, AP) need
every score, so their inputs are gathered.

Each function takes an optional ``comm`` (an mpi4py communicator, e.g. ``ctx.comm``); without it the
metric is computed on the local data only (serial use, and the unit tests' known answers).

Instance segmentation (lab 1): :func:`iou_matrix` and :func:`match` score one image's instances, COCO style;
:class:`InstanceStats` keeps every prediction's score and match, gathers them over the ranks and gives AP50,
AP (IoU 0.50:0.95) and the mean IoU of matched instances of the whole data set.
"""
from __future__ import annotations

import numpy as np


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def allreduce_sum(x, comm=None) -> np.ndarray:
    """Element-wise sum over the ranks of ``comm`` (identity without one)."""
    a = np.ascontiguousarray(_to_numpy(x), dtype=np.float64)
    if comm is None:
        return a
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    out = np.empty_like(a)
    comm.Allreduce(a, out, op=MPI.SUM)
    return out


def allgather_concat(x, comm=None) -> np.ndarray:
    """Concatenate a 1-D array from every rank (rank order)."""
    a = _to_numpy(x).ravel()
    if comm is None:
        return a
    return np.concatenate(comm.allgather(a))


# --------------------------------------------------------------------------- classification / segmentation
def confusion_matrix(pred, target, n_classes: int, ignore_index: int | None = None, comm=None) -> np.ndarray:
    """``C[t, p]`` = number of items of true class t predicted as p, summed over ranks. Shape (n_classes, n_classes)."""
    p, t = _to_numpy(pred).ravel().astype(np.int64), _to_numpy(target).ravel().astype(np.int64)
    if p.shape != t.shape:
        raise ValueError(f"pred and target differ in size: {p.shape} vs {t.shape}")
    keep = np.ones_like(t, dtype=bool) if ignore_index is None else t != ignore_index
    p, t = p[keep], t[keep]
    if t.size and (t.min() < 0 or t.max() >= n_classes or p.min() < 0 or p.max() >= n_classes):
        raise ValueError(f"labels must lie in [0, {n_classes})")
    local = np.bincount(t * n_classes + p, minlength=n_classes * n_classes).reshape(n_classes, n_classes)
    return allreduce_sum(local, comm).astype(np.int64)


def _safe_div(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return np.divide(a, b, out=np.full_like(a, np.nan), where=b > 0)


def segmentation_scores(cm: np.ndarray) -> dict:
    """Pixel accuracy, mean class accuracy, mean IoU and frequency-weighted IoU (Long et al. 2015 definitions).

    Classes absent from both prediction and truth are left out of the means (their IoU is undefined).
    """
    cm = np.asarray(cm, float)
    tp = np.diag(cm)
    support = cm.sum(1)           # true count per class
    predicted = cm.sum(0)
    iou = _safe_div(tp, support + predicted - tp)
    class_acc = _safe_div(tp, support)
    freq = support / cm.sum()
    return {
        "pixel_acc": float(tp.sum() / cm.sum()),
        "mean_class_acc": float(np.nanmean(class_acc)),
        "mean_iou": float(np.nanmean(iou)),
        "fw_iou": float(np.nansum(freq * np.nan_to_num(iou))),
        "iou_per_class": iou.tolist(),
    }


def classification_scores(cm: np.ndarray) -> dict:
    """Accuracy, balanced accuracy, macro-F1 and per-class recall/precision from a confusion matrix."""
    cm = np.asarray(cm, float)
    tp = np.diag(cm)
    recall = _safe_div(tp, cm.sum(1))
    precision = _safe_div(tp, cm.sum(0))
    f1 = _safe_div(2 * np.nan_to_num(precision) * np.nan_to_num(recall),
                   np.nan_to_num(precision) + np.nan_to_num(recall))
    present = cm.sum(1) > 0
    return {
        "accuracy": float(tp.sum() / cm.sum()),
        "balanced_acc": float(np.nanmean(recall[present])),
        "macro_f1": float(np.mean(np.nan_to_num(f1[present]))),
        "recall": recall.tolist(),
        "precision": precision.tolist(),
    }


# --------------------------------------------------------------------------- ranking (anomaly detection)
def roc_auc(scores, labels, comm=None) -> float:
    """Area under the ROC curve (higher score = more positive), ties counted as one half.

    Equals the probability that a random positive scores above a random negative (Mann-Whitney U).
    """
    s, y = allgather_concat(scores, comm).astype(float), allgather_concat(labels, comm).astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUROC needs at least one positive and one negative")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    # average ranks over ties
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def average_precision(scores, labels, comm=None) -> float:
    """Average precision: the mean of precision at the rank of each positive (step-wise area under PR)."""
    s, y = allgather_concat(scores, comm).astype(float), allgather_concat(labels, comm).astype(bool)
    if y.sum() == 0:
        raise ValueError("average precision needs at least one positive")
    order = np.argsort(-s, kind="mergesort")
    hits = y[order]
    precision_at_k = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float(precision_at_k[hits].mean())


# --------------------------------------------------------------------------- instance segmentation (lab 1)
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


# --------------------------------------------------------------------------- regression-style reductions
def global_mean(values, comm=None) -> float:
    """Mean over all items of all ranks (not the mean of per-rank means)."""
    v = _to_numpy(values).astype(float).ravel()
    s = allreduce_sum(np.array([v.sum(), v.size]), comm)
    if s[1] == 0:
        raise ValueError("global_mean of no values")
    return float(s[0] / s[1])
