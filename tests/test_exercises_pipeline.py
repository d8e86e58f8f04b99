"""The coding exercises of notebook 16 (pipeline): the 1F1B order of one stage, and a 1F1B executor.

``tests/test_build_it.py`` runs each reference and its registered mistakes; here: other correct ways to write
them pass, and mistakes that are not registered are still caught."""
from ddlcourse.selfcheck import run_checker


def test_one_f_one_b_accepts_a_hand_written_solution():
    def mine(stage, p, m):
        w = min(p - stage - 1, m)
        ops, f, b = [], 0, 0
        while f < w:
            ops.append(("F", f)); f += 1
        while b < m:
            if f < m:
                ops.append(("F", f)); f += 1
            ops.append(("B", b)); b += 1
        return ops
    v = run_checker("one_f_one_b", mine)
    assert v.ok, v.message


def test_one_f_one_b_names_missing_operations():
    v = run_checker("one_f_one_b", lambda s, p, m: [("F", i) for i in range(m)])
    assert not v.ok and "exactly one F and one B" in v.message


EXECUTOR = """
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
"""


def test_pipeline_1f1b_other_solutions_on_ranks(on_ranks):
    on_ranks(3, EXECUTOR)
