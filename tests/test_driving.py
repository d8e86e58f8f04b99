"""Lab 4 (driving): the physics of the labels, the generator, the metric, and distributed == serial."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from ddlcourse.data import driving as d

from helpers import run_ranks, spy_on_the_device


def _traj(xs, ys=None, heading=0.0, speeds=None, accels=None):
    n = len(xs)
    ys = np.zeros(n) if ys is None else np.asarray(ys, float)
    return np.stack([np.asarray(xs, float), ys, np.full(n, heading), np.zeros(n) if speeds is None else speeds,
                     np.zeros(n) if accels is None else accels], 1)


def test_box_overlap_known_cases():
    a = d.box_corners(0, 0, 0)
    assert d.boxes_overlap(a, d.box_corners(4.0, 0, 0))                 # bumpers overlap by 0.5 m
    assert not d.boxes_overlap(a, d.box_corners(4.6, 0, 0))
    assert not d.boxes_overlap(a, d.box_corners(0, 1.9, 0))             # side by side, 0.1 m apart
    assert d.boxes_overlap(a, d.box_corners(3.0, 0.0, np.pi / 2))       # T-bone: 1.5 + 0.9 > 3.0 - ... overlaps
    assert not d.boxes_overlap(a, d.box_corners(0, 3.3, np.pi / 2))


def test_ttc_known_answer_head_on():
    # ego at x=0 moving +x at 10 m/s; a stopped car 15 m ahead (centres): gap 15 - 4.5 = 10.5 m -> TTC 1.05 s
    ego = np.array([[0, 0, 0, 10.0, 0]])
    other = np.array([[15.0, 0, 0, 0, 0]])
    ttc = d.time_to_collision(ego, other, horizon=3.0, step=0.01)[0]
    assert ttc == pytest.approx(1.05, abs=0.011)
    assert d.time_to_collision(ego, np.array([[15.0, 5.0, 0, 0, 0]]))[0] == np.inf   # other lane: never


def test_labels_follow_the_physics():
    t = np.arange(30) * d.DT
    ego = _traj(10 * t, speeds=np.full(30, 10.0))
    crash = np.stack([ego, _traj(np.full(30, 12.0))])                    # parked car in the way, no braking
    assert d.label(crash)[0] == 2
    # the ego brakes hard and stops 1 m short of a stopped car: near-crash
    v = np.maximum(0, 10 - 8 * t)
    x = np.cumsum(v) * d.DT
    ego_b = _traj(x, speeds=v, accels=np.where(v > 0, -8.0, 0.0))
    stop = x[-1] + d.CAR_L + 1.0
    cls, ttc, decel = d.label(np.stack([ego_b, _traj(np.full(30, stop))]))
    assert cls == 1 and ttc < d.TTC_NEAR and decel >= d.EVASIVE_DECEL
    # the same approach without evasive braking but far away: baseline
    assert d.label(np.stack([ego, _traj(np.full(30, 400.0))]))[0] == 0


def test_quotas_and_chunk_balance():
    assert d.quotas(23).tolist() == [18, 4, 1]
    for n in (1, 5, 46, 100):
        q = d.quotas(n)
        assert q.sum() == n and np.all(np.abs(q - d.PROPORTIONS * n) < 1)
    ch = d.make_chunk(0, 23, np.random.default_rng(0), frames=4, size=16)
    assert np.bincount(ch["label"], minlength=3).tolist() == [18, 4, 1]
    assert ch["video"].shape == (23, 3, 4, 16, 16)
    # the recorded labels are the physics labels: crashes have TTC 0, near-crashes TTC < 1.5 s
    assert np.all(ch["min_ttc"][ch["label"] == 2] == 0)
    assert np.all(ch["min_ttc"][ch["label"] == 1] < d.TTC_NEAR)


def test_forward_camera_sees_closer_cars_bigger_and_brake_lights():
    def view(gap, accel=0.0):
        st = np.zeros((2, 1, 5))
        st[0, 0] = (0, 0, 0, 10, 0)
        st[1, 0] = (gap, 0, 0, 10, accel)
        return d.render_perspective(st, 0, 64)
    near, far = view(10.0), view(30.0)
    assert (near == 0.55).sum() > 2 * (far == 0.55).sum()
    assert (view(10.0, accel=-5.0) == 1.0).sum() > (near == 1.0).sum()    # brake lights glow


def test_generation_is_deterministic_and_shards_cover_everything(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLCOURSE_DATA_DIR", str(tmp_path))
    kw = dict(frames=4, size=16)
    whole = d.generate(46, seed=3, use_cache=False, **kw)
    parts = [d.generate(46, seed=3, rank=r, world_size=2, **kw) for r in range(2)]
    assert sum(len(p["label"]) for p in parts) == 46
    assert np.array_equal(np.concatenate([parts[0]["video"][:23], parts[1]["video"]]), whole["video"])
    with pytest.raises(ValueError, match="3 ranks but only 2 data shard"):
        d.generate(46, seed=3, rank=0, world_size=3, **kw)
    with pytest.raises(ValueError, match="frames >= 2"):
        d.generate(46, frames=1, size=16)


def test_load_clips_reads_only_the_chunks_of_its_block(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLCOURSE_DATA_DIR", str(tmp_path))
    kw = dict(frames=4, size=16)
    whole = d.generate(92, seed=5, use_cache=False, **kw)                   # 4 chunks of 23
    part = d.load_clips(92, 30, 50, seed=5, **kw)                           # clips 30..49: chunks 1 and 2 only
    assert np.array_equal(part["video"], whole["video"][30:50]) and np.array_equal(part["label"], whole["label"][30:50])
    made = sorted(f.name for f in tmp_path.rglob("chunk-*.npz"))
    assert made == ["chunk-00001.npz", "chunk-00002.npz"]
    assert list(d.chunks_of(30, 50)) == [1, 2] and list(d.chunks_of(23, 46)) == [1] and not d.chunks_of(7, 7)
    empty = d.load_clips(92, 10, 10, seed=5, **kw)
    assert empty["video"].shape == (0, 3, 4, 16, 16) and len(empty["label"]) == 0
    with pytest.raises(ValueError, match="outside the data set"):
        d.load_clips(92, 80, 100, **kw)


@pytest.mark.parametrize("n_clips, global_batch", [(46, 8), (920, 16), (23000, 256)])
def test_each_replica_holds_only_its_share_and_batches_do_not_depend_on_ranks(n_clips, global_batch):
    from ddlcourse.cases import driving
    steps = n_clips // global_batch
    for epoch in (0, 1):
        batches = driving.epoch_batches(n_clips, global_batch, epoch, seed=3)
        assert batches.shape == (steps, global_batch)
        assert len(np.unique(batches)) == batches.size                    # no clip twice in one epoch
        for dp in (1, 2, 4, 8):
            blocks = [driving.replica_clips(n_clips, global_batch, dp, r) for r in range(dp)]
            # the replicas' blocks are disjoint, cover the whole training set, and are a 1/dp share each
            assert blocks[0][0] == 0 and blocks[-1][1] == n_clips
            assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
            assert max(hi - lo for lo, hi in blocks) - min(hi - lo for lo, hi in blocks) <= global_batch // dp
            assert all(abs((hi - lo) - n_clips / dp) <= 1 + global_batch // dp for lo, hi in blocks)
            # every clip a replica trains on lies in its block; together they make exactly the global batch
            shares = []
            for r, (lo, hi) in enumerate(blocks):
                mine = batches[:, driving.replica_slots(global_batch, dp, r)]
                assert mine.shape == (steps, global_batch // dp) and np.all((lo <= mine) & (mine < hi))
                shares.append(mine)
            assert np.array_equal(np.concatenate(shares, 1), batches)
    assert not np.array_equal(driving.epoch_batches(n_clips, global_batch, 0), driving.epoch_batches(n_clips, global_batch, 1))
    with pytest.raises(ValueError, match="less than one global batch"):
        driving.epoch_batches(7, 8, 0)


def test_class_weights_from_counts():
    from ddlcourse.cases import driving
    w = driving.class_weights(np.array([18, 4, 1]))
    assert w.tolist() == pytest.approx([23 / 54, 23 / 12, 23 / 3])
    assert float((w * torch.tensor([18.0, 4.0, 1.0])).sum()) == pytest.approx(23)   # mean weight 1 per sample
    assert driving.class_weights(np.array([5, 0, 5])).tolist() == pytest.approx([1.0 * 10 / 15, 0.0, 10 / 15])


@pytest.mark.mpi
@pytest.mark.slow
def test_four_ranks_any_mesh_match_serial_and_resume_is_exact(tmp_path):
    p = run_ranks(4, "driving_meshes_and_resume", timeout=600, env={"DDLCOURSE_DATA_DIR": str(tmp_path / "data"),
                                                                    "DDLCOURSE_RESULTS": str(tmp_path / "results")})
    out = json.loads(p.stdout.strip().splitlines()[-1])
    ref = np.array(out["serial"])
    assert len(ref) == 5 and np.all(np.isfinite(ref))
    for k in ("dp2of4", "dp4", "mp4", "mesh2x2", "horovod"):
        assert np.abs(np.array(out[k]) - ref).max() < 1e-4, (k, out[k], ref.tolist())
    assert np.abs(np.array(out["full"]) - np.array(out["resumed"])).max() < 1e-5
    assert len(out["mresumed"]) == 10 and np.abs(np.array(out["mfull"]) - np.array(out["mresumed"])).max() < 1e-5
    assert out["full"][:5] == pytest.approx(out["serial"], abs=1e-4)
    # each rank held only its replica's share of the 46 training clips: 4 replicas -> 4 disjoint quarters that
    # together are the whole set; the model-parallel ranks of one replica hold the same clips
    n = 46
    assert out["serial_clips"] == [[0, n]]
    for k in ("dp4", "horovod"):
        blocks = out[k + "_clips"]
        assert len(blocks) == 4 and blocks[0][0] == 0 and blocks[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))             # disjoint, nothing missing
        assert all(abs((hi - lo) - n / 4) <= 2 for lo, hi in blocks)            # a quarter each
    assert out["dp2of4_clips"] == [[0, 24], [24, n]]
    assert out["mesh2x2_clips"] == [[0, 24], [0, 24], [24, n], [24, n]]
    assert out["mp4_clips"] == [[0, n]] * 4
    # the class counts (and so the loss weights) are those of the whole set, whatever each rank holds
    assert all(out[k + "_counts"] == [36, 8, 2] for k in ("serial", "dp4", "mp4", "mesh2x2"))


def test_cli_bad_input_is_a_clear_error(capsys):
    # a mesh that does not fit the ranks is found by the running command (a process: it asks MPI for its world)
    p = subprocess.run([sys.executable, "-m", "ddlcourse", "run", "driving", "--scale", "smoke", "mp=3"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "mp=3 must divide the number of ranks 1" in p.stderr
    # the words themselves are checked before anything runs: the same main(), in this process
    from ddlcourse import __main__ as ddl
    for argv, message in ((["--scale", "huge"], "unknown scale 'huge'"), (["--scale", "smoke", "epochs=-3"], "epochs=-3")):
        assert ddl.main(["run", "driving", *argv]) == 2
        assert message in capsys.readouterr().err, argv


def test_config_refuses_what_cannot_work():
    from ddlcourse.cases import driving
    from ddlcourse.training import ConfigError
    with pytest.raises(ConfigError, match="Horovod averages gradients over all ranks, but this run's model is split"):
        driving.Config.make("smoke", mp=2, backend="horovod")
    with pytest.raises(ConfigError, match="does not split into 3 micro-batches"):
        driving.Config.make("smoke", micro_batches=3)
    with pytest.raises(ConfigError, match="unknown driving setting"):
        driving.Config.make("smoke", colour="red")
    with pytest.raises(ConfigError, match="must split into 4 replicas x 4 micro-batches"):
        driving.check_mesh(driving.Config.make("smoke", micro_batches=4), dp=4)


# --------------------------------------------------------------------------- the device
def test_model_and_every_batch_go_through_ctx_to(tmp_path, monkeypatch):
    from ddlcourse.cases import driving
    from ddlcourse.models.driving import MultiViewNet
    monkeypatch.setenv("DDLCOURSE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DDLCOURSE_RESULTS", str(tmp_path / "results"))
    cfg = driving.Config.make("smoke", n_clips=23, n_val=23, frames=4, size=16, width=2, feat=4, hidden=8, epochs=1,
                              global_batch=8, micro_batches=2, measure_memory=True, ranks=1, fresh=True)
    moved_modules, checks, handle = spy_on_the_device(monkeypatch, MultiViewNet)
    try:
        r = driving.train(cfg)
    finally:
        handle.remove()
    assert "MultiViewNet" in moved_modules and "Tensor" not in moved_modules
    # 2 steps x 2 micro-batches, 1 memory pass, 1 validation batch: every one on the device, through ctx.to
    assert len(checks) == 6 and all(checks), checks
    assert r["device"] == "cpu" and r["train_clips"] == [[0, 23]]
