"""Reference solutions of notebooks/06_data_parallel_in_practice.ipynb: gradient accumulation with DDP's ``no_sync``
as a learner writes it (``accumulate_step``), and with one typical mistake each (what its checker,
:mod:`ddlcourse.exercises.checkers.data_parallel_in_practice`, must name)."""
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- build it: gradient accumulation
def _accumulate_step_solution(ddp_model, micro_batches, optimizer, loss_fn):
    """One optimizer step on this rank's share of the global batch, given as k equal micro-batches (x, y):
    DDP all-reduces on the last backward only (no_sync for the others); returns this rank's mean loss."""
    import contextlib
    k = len(micro_batches)
    optimizer.zero_grad()
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        sync = contextlib.nullcontext() if last else ddp_model.no_sync()
        with sync:
            loss = loss_fn(ddp_model(x), y) / k          # k micro-batch means add up to the share's mean
            loss.backward()
        total += loss.item()
    optimizer.step()
    return total


def _acc_variant(kind):
    """The solution with one typical mistake: "not_divided", "no_sync_all", "sync_every", "step_inside",
    "no_zero_grad"."""

    def accumulate_step(ddp_model, micro_batches, optimizer, loss_fn):
        import contextlib
        k = len(micro_batches)
        if kind != "no_zero_grad":
            optimizer.zero_grad()
        total = 0.0
        for i, (x, y) in enumerate(micro_batches):
            skip = kind == "no_sync_all" or (kind != "sync_every" and i < k - 1)
            with ddp_model.no_sync() if skip else contextlib.nullcontext():
                loss = loss_fn(ddp_model(x), y) / (1 if kind == "not_divided" else k)
                loss.backward()
            total += loss.item() / (k if kind == "not_divided" else 1)
            if kind == "step_inside":
                optimizer.step()
        if kind != "step_inside":
            optimizer.step()
        return total

    accumulate_step.__name__ = f"accumulate_step_{kind}"
    return accumulate_step


reference("accumulate_step", mistakes=[
    (_acc_variant("not_divided"), "k times too large"),
    (_acc_variant("no_sync_all"), "never synchronised"),
    (_acc_variant("sync_every"), "extra all-reduces"),
    (_acc_variant("step_inside"), "inside the loop"),
    (_acc_variant("no_zero_grad"), "zero the gradients"),
])(_accumulate_step_solution)
