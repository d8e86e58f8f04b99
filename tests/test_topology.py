"""Lab 03: the topology data generator, the U-Net, the metrics, and train() on 1 and 2 ranks."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from ddlcourse.cases import topology as case
from ddlcourse.data import cache
from ddlcourse.data import topology as T
from ddlcourse.models.topology import UNet
from ddlcourse.physics import simp

from helpers import run_ranks

TINY = dict(n_items=6, chunk_size=2, maxloop=8, seed=3)


@pytest.fixture(scope="module")
def tiny():
    s = T.make_settings((8, 16), **TINY)
    return s, T.load(s, use_cache=False)


# --------------------------------------------------------------------------- generator
def test_generator_is_seeded(tiny):
    s, d = tiny
    again = T.load(s, use_cache=False)
    for k in ("inputs", "target", "compliance", "params"):
        np.testing.assert_array_equal(d[k], again[k])
    other = T.load(T.make_settings((8, 16), **dict(TINY, seed=4)), use_cache=False)
    assert not np.allclose(other["params"], d["params"])


def test_shards_are_disjoint_and_complete(tiny):
    s, d = tiny
    parts = [T.load(s, r, 3, use_cache=False) for r in range(3)]     # 3 chunks of 2 -> one chunk per rank
    got = np.concatenate([p["params"] for p in parts])
    assert len(got) == len(d["params"])
    assert {tuple(r) for r in got} == {tuple(r) for r in d["params"]}
    with pytest.raises(cache.DataError, match="ranks"):
        T.load(s, 0, 4, use_cache=False)


def test_physics_invariants(tiny):
    s, d = tiny
    x = d["target"]
    assert x.min() >= 0 and x.max() <= 1
    np.testing.assert_allclose(x.mean((1, 2)), d["params"][:, 6], atol=5e-3)     # volume constraint holds
    for i in range(len(x)):
        prob = T.problem_from_params(d["params"][i], s["shape"])
        np.testing.assert_allclose(d["inputs"][i], T.encode(prob))            # inputs encode the problem
        assert simp.compliance(prob, x[i]) == pytest.approx(d["compliance"][i], rel=1e-6)
        # the optimised design is far stiffer than spreading the same material uniformly
        assert d["compliance"][i] < simp.compliance(prob, np.full(x[i].shape, x[i].mean()))
    ch = d["inputs"]
    assert np.all(ch[:, 0] == ch[:, :1, :1, :1].reshape(-1, 1, 1))           # volume fraction channel constant
    np.testing.assert_allclose(np.abs(ch[:, 1:3]).sum((2, 3)).max(1) > 0, True)


def test_encoding_of_a_cantilever():
    shape = (4, 8)
    par = np.array([0, 1.0, 0.0, 0.0, 0.5 * np.pi, 0.0, 0.4])    # clamped left edge, load down at top right
    ch = T.encode(T.problem_from_params(par, shape))
    assert ch.shape == (5, 4, 8)
    np.testing.assert_array_equal(ch[3:, :, 0], 1)               # fixed x and y on the first column
    assert ch[3:, :, 1:].sum() == 0
    assert ch[2, 0, 7] == pytest.approx(1.0) and np.count_nonzero(ch[2]) == 1
    assert np.abs(ch[1]).max() < 1e-12


def test_same_seed_same_physics_at_double_resolution():
    a = T.make_settings((8, 16), 4, seed=1, chunk_size=4, maxloop=2)
    b = T.make_settings((16, 32), 4, seed=1, chunk_size=4, maxloop=2, base_nx=16)
    assert b["rmin"] == pytest.approx(2 * a["rmin"])
    pa = T.make_chunk(a, 0, 4, np.random.default_rng([1, 0]))["params"]
    pb = T.make_chunk(b, 0, 4, np.random.default_rng([1, 0]))["params"]
    np.testing.assert_array_equal(pa, pb)


def test_cache_hit_and_corrupt_chunk_regenerated(tmp_path):
    s = T.make_settings((8, 16), **dict(TINY, n_items=4))
    first = T.load(s, root=tmp_path)
    folder = next(tmp_path.iterdir())
    chunks = sorted(folder.glob("chunk-*.npz"))
    assert len(chunks) == 2
    keep_mtime = chunks[1].stat().st_mtime_ns
    chunks[0].write_bytes(b"not a zip file")
    with pytest.warns(UserWarning, match="corrupt"):
        again = T.load(s, root=tmp_path)
    np.testing.assert_array_equal(first["target"], again["target"])
    assert chunks[1].stat().st_mtime_ns == keep_mtime                         # the good shard was not redone
    other = T.make_settings((8, 16), **dict(TINY, n_items=4, maxloop=9))     # other settings, other folder
    assert cache.settings_key(T.VERSION, other) != cache.settings_key(T.VERSION, s)


def test_bad_settings():
    with pytest.raises(cache.DataError, match="shape"):
        T.make_settings((8,), 4)
    with pytest.raises(cache.DataError, match="vf_min"):
        T.make_settings((8, 16), 4, vf_min=0.6, vf_max=0.5)


def test_3d_samples():
    s = T.make_settings((2, 2, 4), n_items=1, chunk_size=1, maxloop=3)
    d = T.load(s, use_cache=False)
    assert d["inputs"].shape == (1, 7, 2, 2, 4) and d["target"].shape == (1, 2, 2, 4)


# --------------------------------------------------------------------------- model
def test_unet_is_fully_convolutional_2d_and_3d():
    m = UNet(5, width=4, depth=2)
    assert m(torch.zeros(2, 5, 8, 16)).shape == (2, 1, 8, 16)
    assert m(torch.zeros(1, 5, 16, 32)).shape == (1, 1, 16, 32)        # double resolution, same weights
    m3 = UNet(7, width=4, depth=1, dim=3)
    assert m3(torch.zeros(1, 7, 4, 4, 8)).shape == (1, 1, 4, 4, 8)
    with pytest.raises(ValueError, match="divisible"):
        m(torch.zeros(1, 5, 6, 16))


# --------------------------------------------------------------------------- metrics
def test_design_scores_known_answers():
    target = np.array([[[1.0, 1.0], [0.0, 0.0]]])
    pred = np.array([[[0.9, 0.2], [0.7, 0.0]]])
    sc = case.scores(case.design_stats(pred, target))
    assert sc["iou"] == pytest.approx(1 / 3)          # TP 1, FP 1, FN 1
    assert sc["accuracy"] == pytest.approx(0.5)
    assert sc["vf_error"] == pytest.approx(abs(0.45 - 0.5))
    perfect = case.scores(case.design_stats(target, target))
    assert perfect == {"iou": 1.0, "accuracy": 1.0, "vf_error": 0.0}
    # sufficient statistics add up: two halves give the metric of the whole
    both = case.design_stats(np.concatenate([pred, target]), np.concatenate([target, target]))
    np.testing.assert_allclose(both, case.design_stats(pred, target) + case.design_stats(target, target))


def test_compliance_ratio_of_simp_design_is_one(tiny):
    s, d = tiny
    r = case.compliance_ratios(d["target"], d["params"], d["compliance"], s["shape"])
    np.testing.assert_allclose(r, 1.0, rtol=1e-6)
    worse = case.compliance_ratios(np.full_like(d["target"], 0.4), d["params"], d["compliance"], s["shape"])
    assert np.all(worse > 1)


def test_config_errors():
    with pytest.raises(ValueError, match="unknown topology setting"):
        case.Config.make("smoke", batch=3)
    with pytest.raises(ValueError, match="unknown scale"):
        case.Config.make("huge")
    with pytest.raises(ValueError, match="unknown optimizer"):
        case.Config.make("smoke", optimizer="adamw2")
    with pytest.raises(ValueError, match="divisible by 2"):
        case.Config.make("smoke", ny=10)
    assert case.Config.make("smoke", epochs=0).epochs == 0        # evaluate only (zero-shot transfer)
    with pytest.raises(ValueError, match="epochs=-3"):
        case.Config.make("smoke", epochs=-3)


# --------------------------------------------------------------------------- train on 1 and 2 ranks


def _run(n, tmp_path, runs):
    """One mpiexec for several runs (name, epochs, resume, backend): each start of torch costs seconds."""
    env = {"DDLCOURSE_DATA_DIR": str(tmp_path / "data"), "DDLCOURSE_RESULTS": str(tmp_path / "results")}
    p = run_ranks(n, "topology_train_runs", json.dumps(runs), env=env)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def _losses(run):
    return np.array([h[1] for h in run["history"]])


@pytest.mark.slow
def test_two_ranks_match_one_rank_resume_is_exact_and_horovod_agrees(tmp_path):
    # horovod first: dist.init is idempotent, so Horovod must be initialised by the first run of the process
    two = _run(2, tmp_path, [("hvd", 2, False, "horovod"), ("two", 2, False, "ddp")])
    # one rank: 2 epochs, then the same run again for 3 epochs (resumes from its checkpoint), then 3 fresh
    one = _run(1, tmp_path, [("one", 2, False, "ddp"), ("one", 3, True, "ddp"), ("fresh", 3, False, "ddp")])
    fresh = one["fresh3"]
    l2, lh = _losses(two["two2"]), _losses(two["hvd2"])
    assert len(l2) == 4
    np.testing.assert_allclose(_losses(fresh)[:4], l2, rtol=1e-5, atol=1e-6)   # same global batches, same losses
    np.testing.assert_allclose(lh, l2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_losses(one["one3"]), _losses(fresh), rtol=1e-6)  # resumed == uninterrupted
    assert one["one3"]["steps"] == fresh["steps"] == 6
    # metrics after 2 epochs are reduced over ranks, so 2 ranks (either backend) report the serial values
    for k in ("iou", "accuracy", "vf_error", "loss", "compliance_ratio_median"):
        for run in (two["two2"], two["hvd2"]):
            assert run["metrics"][k] == pytest.approx(one["one2"]["metrics"][k], rel=1e-4, abs=1e-6), k


def test_corrupt_checkpoint_falls_back(tmp_path, monkeypatch):
    from ddlcourse import training
    monkeypatch.setenv("DDLCOURSE_RESULTS", str(tmp_path))
    model = UNet(5, width=4, depth=1)
    ck = training.Checkpointer(tmp_path / "ck")
    ck.save(1, model)
    ck.save(2, model)
    (tmp_path / "ck" / "epoch-0002.pt").write_bytes(b"garbage")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        done, _ = ck.load(UNet(5, width=4, depth=1))
    assert done == 1
