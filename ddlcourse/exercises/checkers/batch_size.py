"""Checkers of notebooks/02_batch_size.ipynb: its questions, and the learning-rate schedule (the linear scaling rule
with warmup) checked against the package's own (:mod:`ddlcourse.optim`)."""
from ddlcourse.exercises.solutions.batch_size import SCHEDULE_VARIANTS
from ddlcourse.optim import scaled_lr, warmup_factor
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("lr_linear_rule", "multiply the base lr by global_batch / base_batch (Goyal et al. 2017)")
def lr_linear_rule(base_lr: float, base_batch: int, global_batch: int) -> float:
    return scaled_lr(base_lr, global_batch, base_batch, "linear")


@exercise("noise_scale_from_norms",
          "solve E|G_B|^2 = |G|^2 + tr(Sigma)/B at the two batch sizes for |G|^2 and tr(Sigma), then divide")
def noise_scale_from_norms(b_small: int, b_big: int, g2_small: float, g2_big: float) -> float:
    G2 = (b_big * g2_big - b_small * g2_small) / (b_big - b_small)
    tr_sigma = (g2_small - g2_big) / (1 / b_small - 1 / b_big)
    return tr_sigma / G2


# --------------------------------------------------------------------------- coding exercise: the schedule
# (base_lr, base_batch, global_batch, warmup_steps): with and without warmup, growing and equal batches
_SCHEDULE_CASES = [(0.1, 256, 8192, 10), (0.05, 32, 512, 4), (0.2, 64, 64, 3), (0.1, 128, 1024, 0)]


def _schedule_ref(step, base_lr, base_batch, global_batch, warmup_steps):
    return scaled_lr(base_lr, global_batch, base_batch, "linear") * warmup_factor(step, warmup_steps)


SCHEDULE_HINTS = {
    "from_zero": "during warmup the factor is (step + 1) / warmup_steps: step 0 already trains, at lr / warmup_steps",
    "no_warmup": "the warmup is missing: ramp up over the first warmup_steps steps",
    "sqrt_rule": "that is the square-root rule: the linear rule multiplies by global_batch / base_batch",
    "inverted": "the ratio is upside down: a larger global batch gets a LARGER lr (global_batch / base_batch)",
    "from_base_lr": "you ramp from base_lr, as Goyal et al. do; this course's warmup_factor ramps from "
                    "target / warmup_steps (step 0) to the target",
    "never_ends": "after warmup the factor stays at 1: cap (step + 1) / warmup_steps with min(1, ...)",
}


@code_exercise("linear_warmup_schedule")
def check_linear_warmup_schedule(fn) -> Verdict:
    """``fn(step, base_lr, base_batch, global_batch, warmup_steps)`` -> the lr of (0-based) ``step``."""
    def table(f):
        return [float(f(s, *c)) for c in _SCHEDULE_CASES for s in range(3 * max(c[3], 1) + 2)]
    return diagnose(table(fn), table(_schedule_ref),
                    {hint: table(SCHEDULE_VARIANTS[kind]) for kind, hint in SCHEDULE_HINTS.items()},
                    rtol=1e-9, atol=1e-12, what="the lr over the first steps")
