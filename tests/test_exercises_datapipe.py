"""The coding exercise of notebook 14 (each rank's share of a shared per-epoch permutation)."""
import numpy as np

from ddlcourse import sharding
from ddlcourse.exercises import nb14_data_pipeline as ex
from ddlcourse.selfcheck import run_checker


def _written_by_hand(n, global_batch, rank, world_size, epoch, seed):
    order = np.random.default_rng([seed, epoch]).permutation(n)     # the same on every rank
    out = []
    for start in range(0, n, global_batch):                          # ceil: the last batch is kept
        batch = order[start:start + global_batch]
        base, extra = divmod(len(batch), world_size)
        lo = rank * base + min(rank, extra)
        out.append(batch[lo:lo + base + (rank < extra)])
    return out


def test_accepts_the_reference_and_a_hand_written_solution():
    assert run_checker("sharded_reader", sharding.sharded_batches).ok
    assert run_checker("sharded_reader", _written_by_hand).ok


def test_names_typical_mistakes():
    for wrong, hint in ex._READER_MISTAKES:
        v = run_checker("sharded_reader", wrong)
        assert not v.ok and v.message == hint, (wrong.__name__, v.message)


def test_each_mistake_differs_from_the_reference_on_the_cases():
    for wrong, _ in ex._READER_MISTAKES:
        assert any(ex._as_lists(wrong(n, gb, r, ws, e, ex._SEED)) != ex._as_lists(
            sharding.sharded_batches(n, gb, r, ws, e, ex._SEED))
            for n, gb, ws in ex._READER_CASES for e in (0, 1) for r in range(ws)), wrong.__name__


def test_unknown_mistake_is_described():
    v = run_checker("sharded_reader", lambda n, gb, r, ws, e, s: [np.arange(gb)])
    assert not v.ok and "steps, expected" in v.message
