"""Lab 1 (maize): generator geometry, sharding, grouping (the instance metrics are tested in test_metrics),
distributed training against serial, exact resume, and the command line's bad input."""
import json

import numpy as np
import pytest
import torch

from ddlcourse import metrics, training
from ddlcourse.cases import maize as case
from ddlcourse.data import maize as data
from ddlcourse.data.cache import DataError
from ddlcourse.models.maize import OFFSET_SCALE, CropAutoencoder, UNet, group_instances

from helpers import run_ranks


# --------------------------------------------------------------------------- generator geometry
def test_ribbon_is_a_tapered_circular_arc():
    k = 0.1                                              # constant turning rate -> an arc of radius 1/k
    pts, half, t = data.ribbon(np.array([0.0, 0.0]), 0.0, 10.0, k, 3.0, n_samples=200)
    # the centre of the circle lies at distance 1/k to the left of the start heading (y grows with +angle)
    c = np.array([1 / k, 0.0])
    r = np.linalg.norm(pts - c, axis=1)
    assert np.allclose(r, 1 / k, atol=0.05)
    assert half[-1] < half[len(half) // 4] and half.argmax() < len(half) // 2   # widest near the base
    assert np.isclose(np.linalg.norm(np.diff(pts, axis=0), axis=1).sum(), 10.0, rtol=0.01)


def test_straight_ribbon_covers_its_band():
    pts, half, t = data.ribbon(np.array([10.0, 5.0]), 0.0, 20.0, 0.0, 4.0)
    ys, xs, tn, rn = data.rasterise(pts, half, t, (20, 40))
    assert set(np.unique(ys)) <= set(range(7, 14)) and xs.min() >= 3 and xs.max() <= 26
    assert (ys == 10).sum() >= 19                         # the centre line is covered end to end
    assert rn.min() == 0 and rn.max() <= 1


def test_painter_order_gives_exact_visible_masks():
    rng = np.random.default_rng(0)
    img, inst = np.zeros((32, 32, 3)), np.zeros((32, 32), np.int16)
    a = [(*data.ribbon(np.array([16.0, 4.0]), 0.0, 24, 0.0, 6.0), data.GREEN, False, 0)]
    b = [(*data.ribbon(np.array([4.0, 16.0]), np.pi / 2, 24, 0.0, 6.0), data.GREEN, False, 0)]
    data.paint_plant(img, inst, 1, a, rng)
    only_a = inst == 1
    data.paint_plant(img, inst, 2, b, rng)
    ys, xs, _, _ = data.rasterise(*b[0][:3], (32, 32))
    assert (inst[ys, xs] == 2).all()                       # the plant on top is entirely visible
    assert ((inst == 1) == (only_a & (inst != 2))).all()   # the one below keeps what is not covered


def test_make_image_records_are_consistent():
    rng = np.random.default_rng(1)
    for _ in range(6):
        img, inst, rec = data.make_image(rng)
        assert img.shape == (64, 64, 3) and img.dtype == np.uint8 and inst.shape == (64, 64)
        valid = rec[rec[:, 5] > 0]
        kinds = valid[:, 4].astype(int)
        assert ((valid[:, 2] == 0) == (kinds == 3)).all()    # missing plant <-> no instance
        assert inst.max() >= valid[:, 2].max()
        assert ((valid[:, 3] > 0) == (kinds != 3)).all()     # every plant has leaves
        x = img.astype(float) / 255
        exg = 2 * x[..., 1] - x[..., 0] - x[..., 2]
        assert exg[inst > 0].mean() > exg[inst == 0].mean() + 0.1   # plants are greener than soil


def test_generator_is_deterministic_and_sharded(tmp_path):
    s = data.settings(12, 3, seed=5)
    full = data.load(s, 0, 1, use_cache=False)
    again = data.load(s, 0, 1, use_cache=False)
    assert np.array_equal(full["image"], again["image"])
    parts = [data.load(s, r, 2, use_cache=False) for r in range(2)]
    ids = np.concatenate([p["chunk"] for p in parts])
    assert sorted(set(parts[0]["chunk"])) == [0, 2] and sorted(set(parts[1]["chunk"])) == [1, 3]
    assert len(ids) == 12
    for p in parts:                                          # the same images, whatever the world size
        for c in set(p["chunk"]):
            assert np.array_equal(p["image"][p["chunk"] == c], full["image"][full["chunk"] == c])
    with pytest.raises(DataError, match="ranks but only"):
        data.load(s, 0, 5, use_cache=False)
    with pytest.raises(DataError, match="multiple of 8"):
        data.settings(12, 3, seed=5, size=60)


def test_targets_point_to_centroids():
    inst = np.zeros((10, 10), np.int16)
    inst[1:4, 1:4] = 1
    inst[6:9, 2:9] = 2
    t = data.targets(inst)
    yy, xx = np.indices(inst.shape)
    assert np.allclose((yy + t[2])[inst == 1], 2) and np.allclose((xx + t[3])[inst == 1], 2)
    assert np.allclose((yy + t[2])[inst == 2], 7) and np.allclose((xx + t[3])[inst == 2], 5)
    assert t[1][2, 2] == pytest.approx(1.0) and t[0].sum() == 9 + 21


def test_grouping_recovers_instances_from_perfect_outputs():
    rng = np.random.default_rng(3)
    stats = metrics.InstanceStats()
    for _ in range(3):
        _, inst, _ = data.make_image(rng)
        t = torch.from_numpy(data.targets(inst))
        out = torch.stack([(t[0] * 2 - 1) * 10,                       # confident mask logits
                           torch.logit(t[1].clamp(1e-4, 1 - 1e-4)),    # the true heatmap
                           t[2] / OFFSET_SCALE, t[3] / OFFSET_SCALE])
        ids, scores = group_instances(out, min_area=1)
        stats.add(ids.numpy(), scores.numpy(), inst)
    r = stats.result()
    assert r["ap50"] > 0.85 and r["miou_matched"] > 0.85, r


def test_models_shapes():
    assert UNet(4, 2)(torch.zeros(2, 3, 64, 64)).shape == (2, 4, 64, 64)
    ae = CropAutoencoder(latent=5, width=4)
    assert ae.encode(torch.zeros(3, 3, 32, 32)).shape == (3, 5) and ae(torch.zeros(3, 3, 32, 32)).shape == (3, 3, 32, 32)


def test_global_batches_are_the_same_for_any_world_size():
    chunks = np.repeat(np.arange(4), 6)                      # 4 chunks of 6 images, global index = position
    serial = case.global_batches(chunks, 2, seed=0, epoch=1)
    for n in (2, 4):
        per_rank = [np.nonzero(chunks % n == r)[0] for r in range(n)]
        batches = [case.global_batches(chunks[ix], 2, 0, 1) for ix in per_rank]
        for s, glob in enumerate(serial):
            union = np.concatenate([ix[b[s]] for ix, b in zip(per_rank, batches)])
            assert sorted(union) == sorted(glob)
    with pytest.raises(ValueError, match="multiple of per_chunk"):
        case.global_batches(chunks, 4, 0, 0)


# --------------------------------------------------------------------------- training
@pytest.mark.slow
def test_two_ranks_match_one_rank_and_horovod_matches_ddp(tmp_path):
    p = run_ranks(2, "maize_ranks_and_backends", env={"DDLCOURSE_RESULTS": str(tmp_path)})
    out = json.loads(p.stdout.split("JSON")[1])
    for k in (0, 1):                                         # segmentation and autoencoder losses
        assert np.allclose(out["ddp2"][k], out["ddp1"][k], rtol=1e-4), out
        assert np.allclose(out["hvd2"][k], out["ddp2"][k], rtol=1e-5), out


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DDLCOURSE_RESULTS", str(tmp_path))
    kw = dict(backend="ddp", eval=False, stages="seg")
    full = case.train(case.Config.make("smoke", run_name="full", fresh=True, seg_epochs=2, **kw))
    case.train(case.Config.make("smoke", run_name="half", fresh=True, seg_epochs=1, **kw))
    capsys.readouterr()
    resumed = case.train(case.Config.make("smoke", run_name="half", seg_epochs=2, **kw))
    assert "resuming maize/segmentation from epoch 1 of 2" in capsys.readouterr().out
    assert len(resumed["loss"]) == len(full["loss"])
    assert np.allclose(resumed["loss"], full["loss"], rtol=0, atol=1e-7)
    saved = json.loads((tmp_path / "maize" / "result-half.json").read_text())
    assert saved["final_loss"] == pytest.approx(resumed["loss"][-1])


def test_cli_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DDLCOURSE_RESULTS", str(tmp_path))
    assert training.case_cli(case, ["seg_epochs=-1"], scale="smoke") == 2
    assert "seg_epochs=-1: must be >= 1" in capsys.readouterr().err
    assert training.case_cli(case, ["stages=detect"], scale="smoke") == 2
    assert "unknown stage" in capsys.readouterr().err
    assert training.case_cli(case, ["--seg-epochs", "3"], scale="smoke") == 2
    assert "key=value" in capsys.readouterr().err
    ck = tmp_path / "maize" / "ckpt" / "broken" / "segmentation"
    ck.mkdir(parents=True)
    (ck / "epoch-0001.pt").write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning):
        assert training.case_cli(case, ["run_name=broken", "stages=seg", "backend=ddp"], scale="smoke") == 2
    err = capsys.readouterr().err
    assert "no readable checkpoint" in err and "epoch-0001.pt" in err and "--fresh" in err
    assert "weights_only" not in err
    with pytest.raises(ValueError, match="unknown maize setting"):
        case.Config.make("smoke", epochs=3)
    with pytest.raises(ValueError, match="unknown backend"):
        case.Config.make("smoke", backend="mpi")
