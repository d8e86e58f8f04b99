"""Checkers of labs/01_maize.ipynb: the reference answers of its questions (its coding exercise, MyDDP, is
notebook 05's: see :mod:`ddlcourse.exercises.checkers.data_parallel`)."""
from ddlcourse.metrics import average_precision_from_matches
from ddlcourse.selfcheck import exercise


@exercise("maize_ap50", "sort by score; precision after each prediction is TP so far / predictions so far; "
          "AP sums (recall step) x (best precision at that recall or beyond); recall = TP / n_gt")
def maize_ap50(scores, tp, n_gt):
    return average_precision_from_matches(scores, tp, n_gt)


@exercise("maize_micro_batch",
          "every step takes per_chunk images from every chunk; a rank owns n_chunks / world_size chunks")
def maize_micro_batch(n_chunks, per_chunk, world_size):
    return n_chunks // world_size * per_chunk


@exercise("maize_weak_efficiency", "weak scaling keeps the work per rank fixed: ideal time per step stays "
          "the time on 1 rank, so efficiency = t(1) / t(N)")
def maize_weak_efficiency(t1, tn):
    return t1 / tn
