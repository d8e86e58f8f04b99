"""The coding exercises of notebook 27. tests/test_build_it.py checks the references and the registered
mistakes; here: other correct solutions are accepted, and the mistakes differ from the reference on the cases."""
import numpy as np

from ddlcourse import sharding
from ddlcourse.exercises.checkers import data_pipeline as ex
from ddlcourse.exercises.solutions import data_pipeline as sol
from ddlcourse.selfcheck import run_checker

from helpers import check_on_ranks


def test_sharded_reader_accepts_the_package_function():
    assert run_checker("sharded_reader", sharding.sharded_batches).ok


def test_each_reader_mistake_differs_from_the_reference_on_the_cases():
    for wrong in sol.READER_VARIANTS.values():
        assert any(ex._as_lists(wrong(n, gb, r, ws, e, ex._SEED)) != ex._as_lists(
            sharding.sharded_batches(n, gb, r, ws, e, ex._SEED))
            for n, gb, ws in ex._READER_CASES for e in (0, 1) for r in range(ws)), wrong.__name__


def test_unknown_reader_mistake_is_described():
    v = run_checker("sharded_reader", lambda n, gb, r, ws, e, s: [np.arange(gb)])
    assert not v.ok and "steps, expected" in v.message


def test_the_sampler_reference_is_the_package_sampler():
    for n, drop_last in ex._SAMPLER_CASES:
        for ws in (2, 3):
            for r in range(ws):
                _, epochs = ex._sampler_run(sol._SamplerSolution, n, r, ws, drop_last)
                for e, got in zip(ex._SAMPLER_EPOCHS, epochs):
                    order = sharding.epoch_permutation(n, e, ex._SAMPLER_SEED)
                    want = sharding.distributed_sampler_indices(n, r, ws, e, ex._SAMPLER_SEED,
                                                                drop_last=drop_last, order=order)
                    assert got == want.tolist(), (n, drop_last, ws, r, e)


def test_the_sampler_check_accepts_another_correct_sampler():
    check_on_ranks(3, "exercises_datapipe_sampler")
