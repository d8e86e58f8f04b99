"""Checkers of labs/03_topology.ipynb: the reference answers of its questions (its coding exercise, the LAMB
step, is notebook 12's: see :mod:`ddlcourse.exercises.checkers.large_batch`)."""
import numpy as np

from ddlcourse.physics import simp
from ddlcourse.selfcheck import exercise


@exercise("topo_uniform_compliance", "build simp.mbb_beam() and call simp.compliance(problem, x) with x = 0.5 "
          "everywhere on its (20, 60) grid")
def topo_uniform_compliance():
    p = simp.mbb_beam(60, 20, 0.5)
    return simp.compliance(p, np.full(p.shape, 0.5))


@exercise("topo_iou", "IoU of the solid phase = TP / (TP + FP + FN); the true negatives (void predicted as "
          "void) do not count")
def topo_iou(tp, fp, fn, tn):
    return tp / (tp + fp + fn)


@exercise("topo_sqrt_lr", "square-root rule: lr = base_lr * sqrt(global_batch / base_batch)")
def topo_sqrt_lr(base_lr, base_batch, global_batch):
    return base_lr * (global_batch / base_batch) ** 0.5


@exercise("topo_micro_batch", "every rank reads an equal, contiguous slice of each global batch")
def topo_micro_batch(global_batch, world_size):
    return global_batch // world_size
