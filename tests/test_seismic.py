"""Lab 2 (seismic): the generator's geology, sharding, the models' memory, the metric, and train() on 1/2 ranks."""
import numpy as np
import pytest
import torch

from ddlcourse.data import seismic as data
from ddlcourse.models import seismic as models

from helpers import run_ranks, spy_on_the_device


# --------------------------------------------------------------------------- the wavelet
def test_ricker_known_values():
    f = 0.1
    w = data.ricker(101, f)
    assert w[50] == pytest.approx(1.0)                        # peak 1 at t = 0
    assert np.allclose(w, w[::-1])                            # symmetric
    assert abs(w.sum()) < 1e-3 * np.abs(w).sum()              # no DC: a band-pass wavelet
    t0 = 1 / (np.sqrt(2) * np.pi * f)                         # zero crossings at +-1/(sqrt(2) pi f)
    k = 50 + int(t0)
    assert w[k] > 0 > w[k + 1] and w[100 - k] > 0 > w[99 - k]    # the sign changes there
    spec = np.abs(np.fft.rfft(w, 4096))
    assert np.fft.rfftfreq(4096)[spec.argmax()] == pytest.approx(f, rel=0.02)   # peak frequency
    with pytest.raises(ValueError):
        data.ricker(10, f)
    with pytest.raises(ValueError):
        data.ricker(11, 0.7)


# --------------------------------------------------------------------------- the geology
def test_volume_shapes_labels_and_determinism():
    a = data.make_volume((32, 24, 20), seed=3)
    b = data.make_volume((32, 24, 20), seed=3)
    c = data.make_volume((32, 24, 20), seed=4)
    assert a["seismic"].shape == a["labels"].shape == (32, 24, 20)
    assert a["seismic"].dtype == np.float32 and a["labels"].dtype == np.uint8
    assert np.array_equal(a["seismic"], b["seismic"]) and np.array_equal(a["labels"], b["labels"])
    assert not np.array_equal(a["seismic"], c["seismic"])
    assert a["labels"].max() < data.N_FACIES
    assert abs(a["seismic"].mean()) < 1e-4 and a["seismic"].std() == pytest.approx(1, rel=1e-3)
    assert 1 <= a["n_faults"] <= 3


def test_unfaulted_layers_keep_their_order():
    """Folding and shear move layers up and down but never overturn them: facies grow with depth."""
    for seed in range(3):
        lab = data.make_volume((48, 24, 24), seed=seed, n_faults=0)["labels"].astype(int)
        assert (np.diff(lab, axis=0) >= 0).all()
        assert len(np.unique(lab[:, 0, 0])) >= 3       # several facies in every column


def test_faults_displace_layers():
    """A fault makes relative geologic time jump across its plane (a throw); folding alone is smooth."""
    rng = np.random.default_rng(0)
    smooth, _ = data.deformed_tau((48, 32, 32), np.random.default_rng(1), n_faults=0)
    faulted, mask = data.deformed_tau((48, 32, 32), rng, n_faults=1)
    jump = lambda tau: max(np.abs(np.diff(tau, axis=1)).max(), np.abs(np.diff(tau, axis=2)).max())
    assert jump(smooth) < 1.5
    assert jump(faulted) > 2.5                          # the throw: at least 0.06 * depth * sin(55 deg)
    assert mask.any()


def test_facies_proportions_are_f3_like():
    lab = np.concatenate([data.make_volume((64, 32, 32), seed=s)["labels"].ravel() for s in range(4)])
    freq = data.class_frequencies(lab)
    assert (freq > 0).all()                             # every facies occurs
    assert freq.argmax() in (0, 2)                      # a North Sea group dominates
    assert freq[4] < 0.08 and freq[3] < 0.12            # Scruff and Chalk: thin, rare classes


def test_label_changes_between_sections_known_answer():
    lab = np.zeros((2, 4, 3), np.uint8)
    lab[:, 2:, :] = 1                                    # one change between x=1 and x=2, everywhere
    assert data.label_changes_between_sections(lab) == pytest.approx(1 / 3)
    lab[0, 3, 0] = 2                                     # one more changed pair ...and the pair before it
    assert data.label_changes_between_sections(lab) == pytest.approx((6 + 1) / 18)


def test_extract_cubes_covers_everything_and_overlaps():
    vol = np.arange(10 * 9 * 8).reshape(10, 9, 8)
    cubes, corners = data.extract_cubes(vol, (6, 4, 4), (4, 3, 3))
    seen = np.zeros(vol.shape, int)
    for c, (a, b, d) in zip(cubes, corners):
        assert np.array_equal(c, vol[a:a + 6, b:b + 4, d:d + 4])
        seen[a:a + 6, b:b + 4, d:d + 4] += 1
    assert (seen >= 1).all() and (seen > 1).any()       # every voxel, some of them twice
    with pytest.raises(data.DataError):
        data.extract_cubes(vol, (11, 4, 4), (1, 1, 1))


def test_sharding_no_overlap_nothing_missing(tmp_path):
    kw = dict(n_volumes=4, volume=(16, 12, 12), cube=(8, 8, 8), cubes_per_volume=2, seed=5, use_cache=False)
    whole = data.training_cubes(**kw)
    parts = [data.training_cubes(rank=r, world_size=2, **kw) for r in range(2)]
    chunks = [set(p["chunk"].tolist()) for p in parts]
    assert chunks[0].isdisjoint(chunks[1]) and chunks[0] | chunks[1] == set(whole["chunk"].tolist())
    for p in parts:                                     # the same cubes whatever the number of ranks
        for cid in set(p["chunk"].tolist()):
            assert np.array_equal(p["seismic"][p["chunk"] == cid], whole["seismic"][whole["chunk"] == cid])
    with pytest.raises(data.DataError):
        data.training_cubes(rank=0, world_size=8, **kw)


def test_cache_is_used_and_keyed(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLCOURSE_DATA_DIR", str(tmp_path))
    kw = dict(n_volumes=2, volume=(16, 8, 8), cube=(8, 8, 8), cubes_per_volume=1, seed=1)
    a = data.training_cubes(**kw)
    b = data.training_cubes(**kw)                       # from the cache
    assert np.array_equal(a["labels"], b["labels"])
    data.training_cubes(**{**kw, "seed": 2})
    assert len(list(tmp_path.glob("seismic-train-*"))) == 2


# --------------------------------------------------------------------------- models and memory
def test_models_shapes_and_bad_sizes():
    m3, m2 = models.cube_model(4, 2), models.section_model(4, 2)
    assert m3(torch.zeros(1, 1, 16, 8, 12)).shape == (1, 6, 16, 8, 12)
    assert m2(torch.zeros(3, 1, 16, 8)).shape == (3, 6, 16, 8)
    with pytest.raises(ValueError, match="divisible"):
        m3(torch.zeros(1, 1, 10, 8, 8))
    with pytest.raises(ValueError):
        models.UNet(ndim=1)


def test_activation_memory_meta_equals_real_and_grows_with_voxels():
    m = models.cube_model(4, 2)
    before = [p.detach().clone() for p in m.parameters()]
    real = models.activation_bytes(m, (1, 1, 16, 16, 16), device="cpu")
    meta = models.activation_bytes(m, (1, 1, 16, 16, 16), device="meta")
    assert real == meta > 0
    assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))     # the model is untouched
    big = models.activation_bytes(m, (1, 1, 32, 32, 32))
    assert big == pytest.approx(8 * meta, rel=1e-3)                           # linear in the voxels


# --------------------------------------------------------------------------- the case: options and CLI
def test_cli_bad_input_exits_2(capsys):
    from ddlcourse import training
    from ddlcourse.cases import seismic
    assert training.case_cli(seismic, ["model=4d"], scale="smoke") == 2
    assert "unknown model" in capsys.readouterr().err
    assert training.case_cli(seismic, ["spatial=3", "ranks=2"], scale="smoke") == 2
    assert training.case_cli(seismic, ["cube=64,16,16"], scale="smoke") == 2      # past the memory budget
    assert "budget" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown seismic setting"):
        seismic.Config.make("smoke", colour="red")


def test_spatial_split_needs_less_memory_per_rank():
    from ddlcourse.cases import seismic
    cfg = seismic.Config.make("smoke")
    big = seismic.Config.make("smoke", cube=cfg.spatial_cube)
    one = seismic.predicted_activation_mb(big, spatial=1)
    two = seismic.predicted_activation_mb(big, spatial=2)
    assert one > cfg.memory_budget_mb >= two
    assert one / 2 < two < 0.75 * one                   # half the voxels, plus the halo-padded copies


@pytest.fixture(scope="module")
def train_runs(tmp_path_factory):
    import json
    import os
    tmp = tmp_path_factory.mktemp("seismic")
    env = dict(os.environ, DDLCOURSE_RESULTS=str(tmp / "results"), DDLCOURSE_DATA_DIR=str(tmp / "data"))
    old = os.environ.copy()
    os.environ.update(env)
    try:
        p = run_ranks(2, "seismic_train_runs")
    finally:
        os.environ.clear()
        os.environ.update(old)
    out = json.loads(p.stdout.split("RESULT")[1].strip().splitlines()[0])
    out["stderr"] = p.stderr
    return out


def test_two_ranks_match_one(train_runs):
    one, two = np.array(train_runs["one"][0]), np.array(train_runs["two"][0])
    assert len(one) == 4 and np.allclose(one, two, atol=1e-5), (one, two)
    assert np.allclose(train_runs["one2d"][0], train_runs["two2d"][0], atol=1e-5)
    assert train_runs["one"][1] == pytest.approx(train_runs["two"][1], abs=1e-3)


def test_each_backend_averages_its_own_way_and_all_match_serial(train_runs):
    """backend picks how the gradients are averaged, as --help says: DDP (its buckets, with no_sync on all but a
    step's last backward), one allreduce per tensor, or Horovod; all give the serial trajectory."""
    one = np.array(train_runs["one"][0])
    for name in ("two", "spatial", "two_allreduce", "spatial_allreduce", "two_horovod"):
        assert np.allclose(one, train_runs[name][0], atol=1e-5), (name, one, train_runs[name][0])
    made = {name: train_runs[name][4] for name in ("one", "two", "spatial", "two_allreduce", "two_horovod")}
    assert made == {"one": 0, "two": 1, "spatial": 1, "two_allreduce": 0, "two_horovod": 0}, made


def test_spatial_parallel_matches_serial(train_runs):
    one, sp = np.array(train_runs["one"][0]), np.array(train_runs["spatial"][0])
    assert np.allclose(one, sp, atol=1e-5), (one, sp)
    assert train_runs["spatial"][2] < 0.8 * train_runs["one"][2]      # per rank; halos add some
    # the meta-device prediction (with zero halos) matches what the ranks measured
    assert train_runs["one"][3] == pytest.approx(train_runs["one"][2], rel=1e-6)
    assert train_runs["spatial"][3] == pytest.approx(train_runs["spatial"][2], rel=0.1)


def test_resume_continues_exactly(train_runs):
    assert np.allclose(train_runs["half"][0], train_runs["one"][0], atol=1e-6)


def test_corrupt_checkpoint_is_a_clear_error(train_runs):
    assert train_runs["rc_bad_ckpt"] == 2
    err = train_runs["stderr"]
    assert "epoch-0001.pt" in err and "--fresh" in err and "weights_only" not in err


def test_model_and_every_cube_go_through_ctx_to(tmp_path, monkeypatch):
    """Every training forward of the U-Net sees a cube that went through ``ctx.to`` (helpers.spy_on_the_device)."""
    from ddlcourse.cases import seismic
    monkeypatch.setenv("DDLCOURSE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DDLCOURSE_RESULTS", str(tmp_path / "results"))
    small = dict(volume=[32, 16, 16], cube=[16, 8, 8], spatial_cube=[16, 8, 8], n_volumes=2, cubes_per_volume=2,
                 n_test=1, global_batch=4, width=2, levels=2, epochs=1, memory_budget_mb=0, ranks=1, fresh=True)
    for model in ("3d", "2d"):
        moved_modules, checks, handle = spy_on_the_device(monkeypatch, models.UNet)
        try:
            r = seismic.train(seismic.Config.make("smoke", model=model, run_name="dev-" + model, **small))
        finally:
            handle.remove()
        assert "UNet" in moved_modules and r["device"] == "cpu"
        # 1 step of 4 cubes through ctx.to, then the test volume (moved to the model's device by predict_volume)
        assert len(checks) == 5 and all(checks[:4]), (model, checks)
