"""The sharded sampler: disjoint shares whose union is the serial batch; DistributedSampler reproduced."""
import numpy as np
import pytest
import torch

from ddlcourse import sharding as S


@pytest.mark.parametrize("n,gb,k", [(202, 32, 4), (100, 10, 3), (7, 4, 4), (64, 16, 1), (5, 8, 2)])
def test_shares_are_disjoint_and_cover_the_serial_batch(n, gb, k):
    for epoch in range(2):
        serial = S.global_batches(n, gb, epoch, seed=5)
        per_rank = [S.sharded_batches(n, gb, r, k, epoch, seed=5) for r in range(k)]
        assert all(len(p) == len(serial) for p in per_rank)            # same number of steps on every rank
        for i, b in enumerate(serial):
            shares = [p[i] for p in per_rank]
            assert np.array_equal(np.concatenate(shares), b)           # union in order = serial batch
            assert max(map(len, shares)) - min(map(len, shares)) <= 1  # balanced, no padding
        assert sorted(np.concatenate(serial).tolist()) == list(range(n))   # every sample once per epoch


def test_permutation_is_shared_and_changes_per_epoch():
    a = S.epoch_permutation(50, 0, seed=1)
    assert np.array_equal(a, S.epoch_permutation(50, 0, seed=1))
    assert not np.array_equal(a, S.epoch_permutation(50, 1, seed=1))
    assert np.array_equal(S.epoch_permutation(5, 3, shuffle=False), np.arange(5))


def test_split_sizes():
    assert S.split_sizes(10, 4) == [3, 3, 2, 2]
    assert S.split_sizes(2, 4) == [1, 1, 0, 0]


@pytest.mark.parametrize("n,k", [(10, 4), (202, 4), (8, 4), (3, 4)])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_matches_torch_distributed_sampler(n, k, shuffle, drop_last):
    from torch.utils.data import DistributedSampler
    ds = list(range(n))
    for r in range(k):
        ts = DistributedSampler(ds, num_replicas=k, rank=r, shuffle=shuffle, seed=3, drop_last=drop_last)
        ts.set_epoch(2)
        ours = S.distributed_sampler_indices(n, r, k, epoch=2, seed=3, shuffle=shuffle, drop_last=drop_last)
        assert list(ts) == ours.tolist()


def test_padding_duplicates_and_drop_last_loses_samples():
    n, k = 202, 4
    pad = [S.distributed_sampler_indices(n, r, k) for r in range(k)]
    drop = [S.distributed_sampler_indices(n, r, k, drop_last=True) for r in range(k)]
    assert S.duplicates_and_missing(pad, n) == (2, 0)
    assert S.duplicates_and_missing(drop, n) == (0, 2)
    ours = [np.concatenate(S.sharded_batches(n, 32, r, k, 0)) for r in range(k)]
    assert S.duplicates_and_missing(ours, n) == (0, 0)


def test_bad_input():
    with pytest.raises(ValueError, match="rank"):
        S.sharded_batches(10, 4, 4, 4, 0)
    with pytest.raises(ValueError, match="global_batch"):
        S.sharded_batches(10, 0, 0, 1, 0)
