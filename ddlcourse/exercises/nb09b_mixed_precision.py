"""Exercises of notebooks/09b_mixed_precision.ipynb: the dynamic loss-scale update."""
from ddlcourse import amp
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("fp16_master_bytes", "fp16 weights (2) + fp16 gradients (2) + fp32 masters (4) + Adam's two fp32 moments (8)")
def fp16_master_bytes() -> float:
    return float(sum(amp.bytes_per_param("fp16-master").values()))


# overflow flags: clean runs longer and shorter than the interval, overflows in a row, one right after a growth
_FLAGS = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
_KW = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=3)


def _grow_every_step(scale, tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    return (scale * backoff_factor, 0) if found_inf else (scale * growth_factor, 0)


def _no_reset_on_inf(scale, tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    if found_inf:
        return scale * backoff_factor, tracker
    tracker += 1
    return (scale * growth_factor, 0) if tracker == growth_interval else (scale, tracker)


def _no_reset_after_growth(scale, tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    if found_inf:
        return scale * backoff_factor, 0
    tracker += 1
    return (scale * growth_factor, tracker) if tracker >= growth_interval else (scale, tracker)


def _grow_on_inf(scale, tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    if found_inf:
        return scale * growth_factor, 0
    tracker += 1
    return (scale * backoff_factor, 0) if tracker == growth_interval else (scale, tracker)


def _off_by_one(scale, tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    if found_inf:
        return scale * backoff_factor, 0
    tracker += 1
    return (scale * growth_factor, 0) if tracker == growth_interval + 1 else (scale, tracker)


@code_exercise("loss_scale_update")
def check_loss_scale_update(fn) -> Verdict:
    """``fn(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval) -> (scale, tracker)``."""
    def traj(f):
        return amp.scale_trajectory(_FLAGS, fn=f, init_scale=2.0 ** 16, **_KW)
    got = traj(lambda *a, **k: tuple(fn(*a, **k)))
    return diagnose(got, traj(amp.update_scale), {
        "the scale grows only after growth_interval clean steps in a row: count them in growth_tracker":
            traj(_grow_every_step),
        "after an overflow, restart the count of clean steps at 0": traj(_no_reset_on_inf),
        "after growing the scale, restart the count of clean steps at 0": traj(_no_reset_after_growth),
        "the factors are swapped: an overflow multiplies the scale by backoff_factor (it shrinks), "
        "growth_interval clean steps multiply it by growth_factor": traj(_grow_on_inf),
        "the scale grows one step late: grow when the count of clean steps reaches growth_interval":
            traj(_off_by_one),
    }, what="the loss scale after each step")
