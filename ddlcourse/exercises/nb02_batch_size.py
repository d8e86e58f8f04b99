"""Exercises of notebooks/02_batch_size.ipynb."""
from ddlcourse.schedules import scaled_lr
from ddlcourse.selfcheck import exercise


@exercise("lr_linear_rule", "multiply the base lr by global_batch / base_batch (Goyal et al. 2017)")
def lr_linear_rule(base_lr: float, base_batch: int, global_batch: int) -> float:
    return scaled_lr(base_lr, global_batch, base_batch, "linear")


@exercise("noise_scale_from_norms",
          "solve E|G_B|^2 = |G|^2 + tr(Sigma)/B at the two batch sizes for |G|^2 and tr(Sigma), then divide")
def noise_scale_from_norms(b_small: int, b_big: int, g2_small: float, g2_big: float) -> float:
    G2 = (b_big * g2_big - b_small * g2_small) / (b_big - b_small)
    tr_sigma = (g2_small - g2_big) / (1 / b_small - 1 / b_big)
    return tr_sigma / G2
