"""test_exercises_data_parallel_in_practice: the package's accumulate_step and another right one pass; a
summed returned loss and a missing optimizer step are named."""
from tests.ranks._on_ranks import finish, reject, run_checker

import contextlib
from ddlcourse.parallel import data_parallel as dp

v = run_checker("accumulate_step", dp.accumulate_step)
assert v.ok, v.message

def last_outside(ddp_model, micro_batches, optimizer, loss_fn):
    """Right: the first k-1 micro-batches in one no_sync block, the last one after it; returns a tensor."""
    k = len(micro_batches)
    optimizer.zero_grad(set_to_none=False)
    losses = []
    with ddp_model.no_sync():
        for x, y in micro_batches[:-1]:
            loss = loss_fn(ddp_model(x), y) / k
            loss.backward()
            losses.append(loss.detach())
    x, y = micro_batches[-1]
    loss = loss_fn(ddp_model(x), y) / k
    loss.backward()
    optimizer.step()
    return sum(losses) + loss.detach()
v = run_checker("accumulate_step", last_outside)
assert v.ok, v.message

def mean_of_k_but_summed_return(ddp_model, micro_batches, optimizer, loss_fn):
    """The step is right, the returned loss is the sum of the micro-batch means (k times too large)."""
    k = len(micro_batches)
    optimizer.zero_grad()
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        with ddp_model.no_sync() if i < k - 1 else contextlib.nullcontext():
            loss = loss_fn(ddp_model(x), y)
            (loss / k).backward()
        total += loss.item()
    optimizer.step()
    return total
reject("accumulate_step", mean_of_k_but_summed_return, "mean loss")

def no_step(ddp_model, micro_batches, optimizer, loss_fn):
    """Forgets optimizer.step()."""
    k = len(micro_batches)
    optimizer.zero_grad()
    for i, (x, y) in enumerate(micro_batches):
        with ddp_model.no_sync() if i < k - 1 else contextlib.nullcontext():
            (loss_fn(ddp_model(x), y) / k).backward()
    return 0.0
reject("accumulate_step", no_step, "stepped 0 times")

finish()
