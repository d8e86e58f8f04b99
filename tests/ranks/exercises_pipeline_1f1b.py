"""test_exercises_pipeline: a 1F1B executor written with a deque and a flat loop passes; GPipe's order is named
on some rank."""
from tests.ranks._on_ranks import finish, reject_somewhere, run_checker

from collections import deque
def mine(stage, inputs, targets, loss_fn, rank, world, num_micro_batches, send, recv):   # a deque, a flat loop
    m, first, last = num_micro_batches, rank == 0, rank == world - 1
    kept, f, b = deque(), 0, 0
    ahead = min(world - rank - 1, m)
    while b < m:
        if f < m and (f < ahead or f - b <= ahead):
            x = inputs[f] if first else recv(rank - 1).requires_grad_()
            y = stage(x)
            if last:
                y = loss_fn(y, targets[f]) / m
            else:
                send(y, rank + 1)
            kept.append((x, y)); f += 1
            if f <= ahead:
                continue
        x, y = kept.popleft()
        y.backward(None if last else recv(rank + 1))
        if not first:
            send(x.grad, rank - 1)
        b += 1
v = run_checker("pipeline_1f1b", mine)
assert v.ok, v.message
def gpipe(stage, inputs, targets, loss_fn, rank, world, num_micro_batches, send, recv):
    kept = []
    for i in range(num_micro_batches):
        x = inputs[i] if rank == 0 else recv(rank - 1).requires_grad_()
        y = stage(x)
        if rank == world - 1:
            y = loss_fn(y, targets[i]) / num_micro_batches
        else:
            send(y, rank + 1)
        kept.append((x, y))
    for x, y in kept:
        y.backward(None if rank == world - 1 else recv(rank + 1))
        if rank > 0:
            send(x.grad, rank - 1)
reject_somewhere("pipeline_1f1b", gpipe, "GPipe's order")

finish()
