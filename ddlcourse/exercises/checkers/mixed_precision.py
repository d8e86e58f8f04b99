"""Checkers of notebooks/23_mixed_precision.ipynb: its question, the dynamic loss-scale update, and the loss scaler
the learner builds on the ranks."""
from ddlcourse import amp
from ddlcourse.exercises.solutions.mixed_precision import LS_VARIANTS, SCALE_VARIANTS, scaled_sgd_step
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("fp16_master_bytes", "fp16 weights (2) + fp16 gradients (2) + fp32 masters (4) + Adam's two fp32 moments (8)")
def fp16_master_bytes() -> float:
    return float(sum(amp.bytes_per_param("fp16-master").values()))


# overflow flags: clean runs longer and shorter than the interval, overflows in a row, one right after a growth
_FLAGS = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
_KW = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=3)


SCALE_HINTS = {
    "grow_every_step":
        "the scale grows only after growth_interval clean steps in a row: count them in growth_tracker",
    "no_reset_on_inf": "after an overflow, restart the count of clean steps at 0",
    "no_reset_after_growth": "after growing the scale, restart the count of clean steps at 0",
    "grow_on_inf": "the factors are swapped: an overflow multiplies the scale by backoff_factor (it shrinks), "
                   "growth_interval clean steps multiply it by growth_factor",
    "off_by_one": "the scale grows one step late: grow when the count of clean steps reaches growth_interval",
}


@code_exercise("loss_scale_update")
def check_loss_scale_update(fn) -> Verdict:
    """``fn(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval) -> (scale, tracker)``."""
    def traj(f):
        return amp.scale_trajectory(_FLAGS, fn=f, init_scale=2.0 ** 16, **_KW)
    got = traj(lambda *a, **k: tuple(fn(*a, **k)))
    wrong = {hint: traj(SCALE_VARIANTS[kind]) for kind, hint in SCALE_HINTS.items()}
    return diagnose(got, traj(amp.update_scale), wrong, what="the loss scale after each step")


# --------------------------------------------------------------------------- build it: the dynamic loss scaler on ranks
_LS_STEPS, _LS_OVERFLOW_AT = 12, (3, 8, 9)       # overflows on the last rank only, two of them in a row
_LS_KW = dict(lr=0.1, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)


def _ls_run(fn, comm):
    """This rank's trajectory under ``fn``: (taken, scale, tracker) per step, then its parameters."""
    import numpy as np
    import torch
    r, n = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng([5, r])
    params = [torch.tensor(rng.normal(size=s), dtype=torch.float32, requires_grad=True) for s in ((3,), (2, 2))]
    state = {"scale": 2.0 ** 10, "tracker": 0}
    steps = []
    for s in range(_LS_STEPS):
        tg = np.random.default_rng([7, r, s])
        targets = [torch.tensor(tg.normal(size=tuple(p.shape)) + 2.0, dtype=torch.float32) for p in params]
        big = 1e38 if r == n - 1 and s in _LS_OVERFLOW_AT else 1.0   # this rank's scaled gradients overflow
        for p in params:
            p.grad = None
        loss = big * sum(0.5 * ((p - t) ** 2).sum() for p, t in zip(params, targets))
        taken = fn(params, loss, state, comm, **_LS_KW)
        steps.append((bool(taken), float(state["scale"]), int(state["tracker"])))
    flat = torch.cat([p.detach().reshape(-1) for p in params]).tolist()
    return steps, flat


def _ls_same(a, b) -> bool:
    import numpy as np
    (sa, pa), (sb, pb) = a, b
    return sa == sb and len(pa) == len(pb) and bool(np.allclose(pa, pb, rtol=1e-5, atol=1e-6, equal_nan=True))


@code_exercise("scaled_sgd_step", distributed=True, ranks=(2, 3))
def check_scaled_sgd_step(fn, **_) -> Verdict:
    """On every rank: ``fn(params, loss, state, comm, ...)`` for 12 steps, with overflows on the last rank only;
    the steps taken, the scale and the count of clean steps after each step, and the parameters at the end, of all
    ranks (gathered, so every rank gives the same verdict), against the reference and the typical mistakes."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    mine = _ls_run(fn, comm)
    got = comm.allgather(mine)
    # the reference solution's trajectory: the package has no scaler that all-reduces found_inf over MPI ranks
    ref = comm.allgather(_ls_run(scaled_sgd_step, comm))
    if all(_ls_same(g, f) for g, f in zip(got, ref)):
        return Verdict(True)
    hints = {
        "local": f"an overflow on rank {n - 1} only must skip the step on every rank: all-reduce found_inf "
                 "(comm.allreduce) before you decide; each rank sees only its own gradients",
        "no_skip": "on an overflow skip the step (no parameter update): the gradients are inf or nan",
        "no_backoff": "on an overflow multiply the scale by backoff_factor (halve it), and restart the count at 0",
        "no_unscale": "unscale: divide the gradients by the scale before the update (they were multiplied by it)",
        "no_reset": "after growing the scale, restart the count of clean steps at 0: grow once per "
                    "growth_interval clean steps",
    }
    for kind, hint in hints.items():
        wrong = comm.allgather(_ls_run(LS_VARIANTS[kind], comm))
        if all(_ls_same(g, w) for g, w in zip(got, wrong)):
            return Verdict(False, hint)
    for r, ((sg, pg), (sr, pr)) in enumerate(zip(got, ref)):
        for s, (a, b) in enumerate(zip(sg, sr)):
            if a != b:
                return Verdict(False, f"rank {r}, step {s} (overflow on rank {n - 1} at steps "
                                      f"{list(_LS_OVERFLOW_AT)}): (taken, scale, tracker) is {a}, expected {b}")
    return Verdict(False, "the steps and scales are right but the parameters differ: the update is "
                          "p -= lr * grad / scale on a step that is taken")
