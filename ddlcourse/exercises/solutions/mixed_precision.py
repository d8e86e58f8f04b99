"""Reference solutions of notebooks/23_mixed_precision.ipynb: the dynamic loss-scale update and the loss scaler on the
ranks, and each with one typical mistake (what :mod:`ddlcourse.exercises.checkers.mixed_precision` must name)."""
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- the dynamic loss-scale update
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


SCALE_VARIANTS = {
    "grow_every_step": _grow_every_step,
    "no_reset_on_inf": _no_reset_on_inf,
    "no_reset_after_growth": _no_reset_after_growth,
    "grow_on_inf": _grow_on_inf,
    "off_by_one": _off_by_one,
}


@reference("loss_scale_update", mistakes=[
    (_grow_every_step, "count them in growth_tracker"),
    (_no_reset_on_inf, "after an overflow, restart the count"),
    (_no_reset_after_growth, "after growing the scale, restart the count"),
    (_grow_on_inf, "the factors are swapped"),
    (_off_by_one, "one step late"),
])
def update_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    """Return (new scale, new growth_tracker) after a step, as GradScaler.update does."""
    if found_inf:                                   # the step was skipped: shrink the scale, count again from 0
        return scale * backoff_factor, 0
    growth_tracker += 1
    if growth_tracker == growth_interval:           # growth_interval clean steps in a row: try a larger scale
        return scale * growth_factor, 0
    return scale, growth_tracker


# --------------------------------------------------------------------------- build it: the dynamic loss scaler on ranks
def scaled_sgd_step(params, loss, state, comm, lr=0.1, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    """One SGD step with a dynamic loss scale on a rank that holds its own shard ``params`` of the model.

    ``loss``: this rank's loss (a scalar tensor, backward not called yet); ``state``: ``{"scale", "tracker"}``,
    updated in place; ``comm``: the MPI communicator. Returns True when the step was taken, False when skipped."""
    import torch
    (loss * state["scale"]).backward()                          # every gradient x scale: no underflow
    local_inf = any(not bool(torch.isfinite(p.grad).all()) for p in params)
    found_inf = comm.allreduce(int(local_inf)) > 0              # an overflow on any rank skips the step on all
    if found_inf:
        state["scale"] *= backoff_factor
        state["tracker"] = 0
    else:
        with torch.no_grad():
            for p in params:
                p -= lr * (p.grad / state["scale"])             # unscale, then the SGD step
        state["tracker"] += 1
        if state["tracker"] == growth_interval:
            state["scale"] *= growth_factor
            state["tracker"] = 0
    for p in params:
        p.grad = None
    return not found_inf


def _ls_variant(kind):
    """scaled_sgd_step with one typical mistake: "local" (found_inf not all-reduced), "no_skip" (the step is taken
    anyway), "no_backoff" (the scale is not reduced), "no_unscale" (scaled gradients applied), "no_reset" (the count
    of clean steps goes on after a growth)."""
    def step(params, loss, state, comm, lr=0.1, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        import torch
        (loss * state["scale"]).backward()
        found_inf = any(not bool(torch.isfinite(p.grad).all()) for p in params)
        if kind != "local":
            found_inf = comm.allreduce(int(found_inf)) > 0
        if not found_inf or kind == "no_skip":
            with torch.no_grad():
                for p in params:
                    p -= lr * (p.grad if kind == "no_unscale" else p.grad / state["scale"])
        if found_inf:
            state["scale"] *= 1.0 if kind == "no_backoff" else backoff_factor
            state["tracker"] = 0
        else:
            state["tracker"] += 1
            if state["tracker"] >= growth_interval if kind == "no_reset" else state["tracker"] == growth_interval:
                state["scale"] *= growth_factor
                state["tracker"] = state["tracker"] if kind == "no_reset" else 0
        for p in params:
            p.grad = None
        return not found_inf
    step.__name__ = f"scaled_sgd_step_{kind}"
    return step


LS_VARIANTS = {kind: _ls_variant(kind) for kind in ("local", "no_skip", "no_backoff", "no_unscale", "no_reset")}

reference("scaled_sgd_step", mistakes=[
    (LS_VARIANTS["local"], "all-reduce found_inf"),
    (LS_VARIANTS["no_skip"], "skip the step"),
    (LS_VARIANTS["no_backoff"], "backoff_factor"),
    (LS_VARIANTS["no_unscale"], "unscale"),
    (LS_VARIANTS["no_reset"], "after growing the scale"),
])(scaled_sgd_step)
