"""Reference solutions of notebooks/02_batch_size.ipynb: the learning-rate schedule (the linear scaling rule with
warmup) as a learner writes it, and the schedule with one typical mistake each (what its checker,
:mod:`ddlcourse.exercises.checkers.batch_size`, must name)."""
from ddlcourse.optim import scaled_lr, warmup_factor
from ddlcourse.selfcheck import reference


def _from_zero(step, base_lr, base_batch, global_batch, warmup_steps):     # step / warmup: starts at lr 0
    f = min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0
    return scaled_lr(base_lr, global_batch, base_batch, "linear") * f


def _no_warmup(step, base_lr, base_batch, global_batch, warmup_steps):
    return scaled_lr(base_lr, global_batch, base_batch, "linear")


def _sqrt_rule(step, base_lr, base_batch, global_batch, warmup_steps):
    return scaled_lr(base_lr, global_batch, base_batch, "sqrt") * warmup_factor(step, warmup_steps)


def _inverted(step, base_lr, base_batch, global_batch, warmup_steps):     # base_batch / global_batch
    return base_lr * base_batch / global_batch * warmup_factor(step, warmup_steps)


def _from_base_lr(step, base_lr, base_batch, global_batch, warmup_steps):  # Goyal et al.'s ramp from base_lr
    target = scaled_lr(base_lr, global_batch, base_batch, "linear")
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    return base_lr + (target - base_lr) * step / warmup_steps


def _never_ends(step, base_lr, base_batch, global_batch, warmup_steps):   # the ramp is not capped at 1
    f = (step + 1) / warmup_steps if warmup_steps > 0 else 1.0
    return scaled_lr(base_lr, global_batch, base_batch, "linear") * f


SCHEDULE_VARIANTS = {"from_zero": _from_zero, "no_warmup": _no_warmup, "sqrt_rule": _sqrt_rule, "inverted": _inverted,
                     "from_base_lr": _from_base_lr, "never_ends": _never_ends}


def _lr_at_solution(step, base_lr, base_batch, global_batch, warmup_steps):
    """The lr of (0-based) ``step``, as a learner writes it."""
    target = base_lr * global_batch / base_batch         # the linear scaling rule
    if warmup_steps <= 0:
        return target
    return target * min(1.0, (step + 1) / warmup_steps)


reference("linear_warmup_schedule", mistakes=[
    (_from_zero, "step 0 already trains"), (_no_warmup, "the warmup is missing"),
    (_sqrt_rule, "the square-root rule"), (_inverted, "the ratio is upside down"),
    (_from_base_lr, "you ramp from base_lr"), (_never_ends, "cap (step + 1) / warmup_steps")])(_lr_at_solution)
