import numpy as np
import pytest

from ddlcourse.data import cache


def make(cid, n, rng):
    return {"x": rng.standard_normal((n, 3)).astype(np.float32), "id": np.arange(n) + cid * 4}


SET = {"n_items": 10, "chunk_size": 4, "seed": 3}


def test_shards_cover_everything_once_and_data_is_world_size_independent(tmp_path):
    whole = cache.load_or_make("t", "v1", SET, make, 0, 1, root=tmp_path)
    assert whole["id"].tolist() == list(range(10))
    for n in (2, 3):
        parts = [cache.load_or_make("t", "v1", SET, make, r, n, root=tmp_path) for r in range(n)]
        ids = np.concatenate([p["id"] for p in parts])
        assert sorted(ids.tolist()) == list(range(10))          # nothing missing, no overlap
        x = np.concatenate([p["x"] for p in parts])[np.argsort(ids)]
        assert np.array_equal(x, whole["x"])                     # same data whatever the sharding


def test_deterministic_and_cache_keyed_by_settings(tmp_path):
    a = cache.load_or_make("t", "v1", SET, make, use_cache=False)
    b = cache.load_or_make("t", "v1", SET, make, root=tmp_path)
    assert np.array_equal(a["x"], b["x"])
    assert cache.settings_key("v1", SET) != cache.settings_key("v2", SET)
    assert cache.settings_key("v1", SET) != cache.settings_key("v1", {**SET, "seed": 4})
    c = cache.load_or_make("t", "v1", {**SET, "seed": 4}, make, root=tmp_path)
    assert not np.array_equal(a["x"], c["x"])


def test_more_ranks_than_shards_is_a_clear_error():
    with pytest.raises(cache.DataError, match="4 ranks but only 3 data shard"):
        cache.chunks_of_rank(10, 4, 0, 4)


def test_corrupt_chunk_is_regenerated_and_others_kept(tmp_path):
    first = cache.load_or_make("t", "v1", SET, make, root=tmp_path)
    folder = next(tmp_path.glob("t-*"))
    (folder / "chunk-00001.npz").write_bytes(b"garbage")
    mtime0 = (folder / "chunk-00000.npz").stat().st_mtime_ns
    with pytest.warns(UserWarning, match="corrupt"):
        again = cache.load_or_make("t", "v1", SET, make, root=tmp_path)
    assert np.array_equal(first["x"], again["x"])
    assert (folder / "chunk-00000.npz").stat().st_mtime_ns == mtime0


def test_missing_settings():
    with pytest.raises(cache.DataError, match="lack 'seed'"):
        cache.load_or_make("t", "v1", {"n_items": 1, "chunk_size": 1}, make)


def test_a_full_disk_or_quota_names_the_cache_and_the_variable_and_leaves_no_partial_chunk(tmp_path, monkeypatch):
    """On a cluster the default cache sits in $HOME, whose quota the labs' data outgrow ("Disk quota exceeded"):
    the error says which folder filled up and how to move it, and no half-written chunk is left holding space."""
    import errno

    def quota_exceeded(file, **arrays):
        with open(file, "wb") as f:
            f.write(b"part of a chunk")
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(np, "savez", quota_exceeded)
    with pytest.raises(OSError, match="Disk quota exceeded while writing the data cache .*DDLCOURSE_DATA_DIR") as e:
        cache.load_or_make("t", "v1", SET, make, root=tmp_path)
    assert e.value.errno == errno.EDQUOT and str(tmp_path) in str(e.value)
    folder = next(tmp_path.glob("t-*"))
    assert sorted(p.name for p in folder.iterdir()) == ["settings.json"]


def test_the_cache_follows_ddlcourse_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLCOURSE_DATA_DIR", str(tmp_path / "scratch"))
    cache.load_or_make("t", "v1", SET, make)
    assert cache.cache_root() == tmp_path / "scratch" and len(list((tmp_path / "scratch").glob("t-*/chunk-*.npz"))) == 3
