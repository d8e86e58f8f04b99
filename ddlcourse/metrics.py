"""Metrics computed correctly across ranks.

The rule: reduce the *sufficient statistics* (a confusion matrix, sums and counts), never average per-rank
metrics. Averaging rank 0's IoU with rank 1's is wrong whenever the shards differ in size or content; a
summed confusion matrix gives exactly the metric of the whole data set. Ranking metrics (AUROC, AP) need
every score, so their inputs are gathered.

Each function takes an optional ``comm`` (an mpi4py communicator, e.g. ``ctx.comm``); without it the
metric is computed on the local data only (serial use, and the unit tests' known answers).
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
    from mpi4py import MPI
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


# --------------------------------------------------------------------------- regression-style reductions
def global_mean(values, comm=None) -> float:
    """Mean over all items of all ranks (not the mean of per-rank means)."""
    v = _to_numpy(values).astype(float).ravel()
    s = allreduce_sum(np.array([v.sum(), v.size]), comm)
    if s[1] == 0:
        raise ValueError("global_mean of no values")
    return float(s[0] / s[1])
