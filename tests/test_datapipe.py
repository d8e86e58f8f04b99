"""ddlcourse.datapipe: the sharded format round-trips, ranks read only their shards, loaders agree."""
import importlib
import json

import numpy as np
import pytest
import torch

from ddlcourse import datapipe, storage
from ddlcourse.datapipe import ShardError, ShardedArrayDataset

from helpers import run_ranks


def _chunks(n, chunk, seed=0):
    g = np.random.default_rng(seed)
    x = g.standard_normal((n, 3, 2)).astype(np.float32)
    y = np.arange(n, dtype=np.int64)
    for s in range(0, n, chunk):
        yield {"x": x[s:s + chunk], "y": y[s:s + chunk]}
    return x, y


def _full(n, seed=0):
    g = np.random.default_rng(seed)
    return g.standard_normal((n, 3, 2)).astype(np.float32), np.arange(n, dtype=np.int64)


def test_roundtrip_and_index(tmp_path):
    idx = datapipe.write_shards(_chunks(23, 7), tmp_path, samples_per_shard=5)
    assert [s["count"] for s in idx["shards"]] == [5, 5, 5, 5, 3]   # chunk size does not matter
    on_disk = json.loads((tmp_path / "index.json").read_text())
    assert on_disk["count"] == 23 and on_disk["keys"] == ["x", "y"]
    assert on_disk["spec"]["x"] == {"dtype": "<f4", "shape": [3, 2]}
    ds = ShardedArrayDataset(tmp_path)
    x, y = _full(23)
    got_x = np.stack([ds[i][0] for i in range(len(ds))])
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(ds.arrays()[1], y)
    assert datapipe.verify(tmp_path)


def test_hash_detects_change_and_is_stable(tmp_path):
    a = datapipe.write_shards(_chunks(20, 20), tmp_path / "a", 8)
    b = datapipe.write_shards(_chunks(20, 3), tmp_path / "b", 8)       # other chunking, same content
    assert a["content_sha256"] == b["content_sha256"]
    c = datapipe.write_shards(_chunks(20, 20, seed=1), tmp_path / "c", 8)
    assert a["content_sha256"] != c["content_sha256"]
    arr = np.load(tmp_path / "a" / "shard-00001-x.npy")
    arr[0] += 1
    np.save(tmp_path / "a" / "shard-00001-x.npy", arr)
    assert not datapipe.verify(tmp_path / "a")


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ranks_partition_and_open_only_their_shards(tmp_path, world_size):
    datapipe.write_shards(_chunks(40, 9), tmp_path, samples_per_shard=10)
    seen = []
    for r in range(world_size):
        ds = ShardedArrayDataset(tmp_path, rank=r, world_size=world_size)
        ys = [int(ds[i][1]) for i in range(len(ds))]
        assert len(ds) == 40 // world_size
        assert ds.shards_opened == set(ds.my_shards)
        expected = {s for s in range(4) if s * 10 < ds.stop and (s + 1) * 10 > ds.start}
        assert set(ds.my_shards) == expected
        seen += ys
    assert len(seen) == len(set(seen))                 # no overlap
    assert len(seen) == (40 // world_size) * world_size  # remainder dropped only


def test_rank_range_uneven():
    assert datapipe.rank_range(10, 2, 3) == (6, 9)
    assert [datapipe.rank_range(10, r, 3, equal=False) for r in range(3)] == [(0, 3), (3, 6), (6, 10)]
    with pytest.raises(ShardError):
        datapipe.rank_range(2, 0, 3)


def test_convert_shapes_and_dataloader_workers(tmp_path):
    idx = datapipe.convert(datapipe.shapes_chunks(50, chunk=16, size=12, seed=3), tmp_path, 20, max_samples=45)
    assert idx["count"] == 45 and idx["keys"] == ["inputs", "targets"]
    ds = ShardedArrayDataset(tmp_path, rank=1, world_size=2)
    loader0 = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=0)
    loader2 = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, prefetch_factor=2)
    b0 = [b for b in loader0]
    b2 = [b for b in loader2]
    assert len(b0) == len(b2) == 3
    for (x0, y0), (x2, y2) in zip(b0, b2):
        assert x0.shape[1:] == (1, 12, 12) and x0.dtype == torch.float32
        assert torch.equal(x0, x2) and torch.equal(y0, y2)
    from ddlcourse.data import toy
    X, y = toy.shapes(16, size=12, seed=4)   # global samples 16..31 = chunk 1
    np.testing.assert_array_equal(ds.arrays()[0][:32 - 22], X[22 - 16:].numpy())


def test_bad_input(tmp_path):
    with pytest.raises(ShardError, match="same number of samples"):
        datapipe.write_shards([{"x": np.zeros((3, 2)), "y": np.zeros(4)}], tmp_path / "a", 2)
    with pytest.raises(ShardError, match="does not match"):
        datapipe.write_shards([np.zeros((3, 2)), np.zeros((3, 5))], tmp_path / "b", 2)
    with pytest.raises(ShardError, match="empty"):
        datapipe.write_shards([], tmp_path / "c", 2)
    with pytest.raises(ShardError, match="no index.json"):
        ShardedArrayDataset(tmp_path / "nothing")
    datapipe.write_shards([np.zeros((3, 2))], tmp_path / "d", 2)
    with pytest.raises(ShardError, match="overwrite"):
        datapipe.write_shards([np.zeros((3, 2))], tmp_path / "d", 2)
    with pytest.raises(ShardError, match="pairs"):
        datapipe.convert(iter([np.zeros(3)]), tmp_path / "e", 2)


def test_timing_helpers_run(tmp_path):
    datapipe.write_shards(_chunks(64, 64), tmp_path, 16)
    ds = datapipe.SlowReads(ShardedArrayDataset(tmp_path), 0.0)
    loader = torch.utils.data.DataLoader(ds, batch_size=8)
    rep = datapipe.input_bound_report(loader, lambda b: b[0].sum(), n_batches=3)
    assert set(rep) >= {"loader_s", "step_s", "both_s", "wait_fraction"}
    recs = datapipe.measure_loader_settings(ds, None, 8, [dict(num_workers=0), dict(pin_memory=True)], 3)
    assert recs[0]["loader_samples_per_s"] > 0
    assert ("skipped" in recs[1]) == (not torch.cuda.is_available())


def test_contention_on_two_ranks(tmp_path):
    storage.make_contention_files(tmp_path, 2, 0.25)
    p = run_ranks(2, "datapipe_contention", tmp_path)
    mb = int(0.25 * 2**20)
    assert f"('one_file_whole', 2, {4 * mb})" in p.stdout      # every rank reads both slices
    assert f"('one_file_slices', 2, {2 * mb})" in p.stdout
    assert f"('own_files', 1, {mb})" in p.stdout


def _case_sample(case):
    """A small sample of a case study's generated data (a dict of arrays), made without the disk cache."""
    mod = importlib.import_module(f"ddlcourse.data.{case}")
    if case == "maize":
        return mod.load(mod.settings(3, 1, 0, size=32), use_cache=False)
    if case == "seismic":
        return mod.training_cubes(1, (16, 16, 16), (8, 8, 8), 3, use_cache=False)
    if case == "driving":
        return mod.generate(3, 2, 16, chunk_size=2, use_cache=False)
    return mod.load(mod.make_settings((8, 16), 3, chunk_size=1, maxloop=3), use_cache=False)


@pytest.mark.parametrize("case", ["maize", "seismic", "topology", "driving"])
def test_convert_case_study_sample(case, tmp_path):
    """A case study's data converts into the sharded format and reads back unchanged, split over 2 ranks."""
    try:
        arrays = _case_sample(case)
    except (ImportError, AttributeError, TypeError) as e:   # module absent, or its API changed
        pytest.skip(f"ddlcourse.data.{case} not usable here: {type(e).__name__}: {e}")
    idx = datapipe.from_arrays(arrays, tmp_path, samples_per_shard=2)
    assert idx["count"] == 3 and datapipe.verify(tmp_path)
    full = ShardedArrayDataset(tmp_path).arrays()
    for k, got in zip(idx["keys"], full):
        np.testing.assert_array_equal(got, np.asarray(arrays[k]))
    r0, r1 = (ShardedArrayDataset(tmp_path, r, 2, equal=False) for r in (0, 1))
    assert len(r0) + len(r1) == 3 and r0.my_shards == [0] and r1.my_shards == [0, 1]


def test_shard_ids_and_the_block_vs_permutation_trade_off(tmp_path):
    from ddlcourse import sharding
    datapipe.convert(datapipe.shapes_chunks(100, chunk=30, size=8, seed=0), tmp_path, samples_per_shard=16)
    index = datapipe.read_index(tmp_path)                      # 7 shards: 6 x 16 + 4
    assert datapipe.shard_ids(index, [0, 15, 16, 99]) == {0, 1, 6}
    with pytest.raises(ShardError):
        datapipe.shard_ids(index, [100])
    blocks = [ShardedArrayDataset(tmp_path, r, 3) for r in range(3)]
    # blocks: the same samples every epoch, the remainder (100 % 3 = 1) never read, few shards per rank
    assert sum(len(b) for b in blocks) == 99
    assert all(datapipe.shard_ids(index, range(b.start, b.stop)) == set(b.my_shards) for b in blocks)
    # a shared permutation: everything read once per epoch, and each rank touches more shards
    for epoch in (0, 1):
        per_rank = [np.concatenate(sharding.sharded_batches(100, 16, r, 3, epoch)) for r in range(3)]
        assert sorted(np.concatenate(per_rank).tolist()) == list(range(100))
        assert all(len(datapipe.shard_ids(index, p)) > len(b.my_shards) for p, b in zip(per_rank, blocks))
