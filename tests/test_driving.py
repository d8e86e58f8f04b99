"""Lab 4 (driving): the physics of the labels, the generator, the metric, and distributed == serial."""
import json
import subprocess
import sys

import numpy as np
import pytest

from ddlcourse.data import driving as d


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


DIST = r"""
import json, numpy as np
from ddlcourse import dist
from ddlcourse.cases import driving
out = {}
for name, kw in {"serial": dict(ranks=1), "dp2of4": dict(ranks=2), "dp4": dict(), "mp4": dict(mp=4, micro_batches=2),
                 "mesh2x2": dict(mp=2, micro_batches=2), "horovod": dict(backend="horovod")}.items():
    cfg = driving.from_scale("smoke", resume=False, run_name="t-" + name, epochs=1, **kw)
    r = driving.train(cfg)
    if dist.rank() == 0:
        out[name] = r["history"]
# resume: 2 epochs in one go == 1 epoch, then resume for the 2nd
a = driving.train(driving.from_scale("smoke", resume=False, run_name="t-full", epochs=2))
driving.train(driving.from_scale("smoke", resume=False, run_name="t-half", epochs=1))
b = driving.train(driving.from_scale("smoke", resume=True, run_name="t-half", epochs=2))
if dist.rank() == 0:
    out["full"], out["resumed"] = a["history"], b["history"]
    print(json.dumps(out))
"""


@pytest.mark.mpi
@pytest.mark.slow
def test_four_ranks_any_mesh_match_serial_and_resume_is_exact(mpi, tmp_path):
    p = mpi(4, DIST, timeout=600, env={"DDLCOURSE_DATA_DIR": str(tmp_path / "data"),
                                       "DDLCOURSE_RESULTS": str(tmp_path / "results")})
    out = json.loads(p.stdout.strip().splitlines()[-1])
    ref = np.array(out["serial"])
    assert len(ref) == 5 and np.all(np.isfinite(ref))
    for k in ("dp2of4", "dp4", "mp4", "mesh2x2", "horovod"):
        assert np.abs(np.array(out[k]) - ref).max() < 1e-4, (k, out[k], ref.tolist())
    assert np.abs(np.array(out["full"]) - np.array(out["resumed"])).max() < 1e-5
    assert out["full"][:5] == pytest.approx(out["serial"], abs=1e-4)


def test_cli_bad_input_is_a_clear_error():
    p = subprocess.run([sys.executable, "-m", "ddlcourse", "run", "driving", "--scale", "smoke", "--mp", "3"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "mp=3 must divide the number of ranks 1" in p.stderr
    p = subprocess.run([sys.executable, "-m", "ddlcourse", "run", "driving", "--scale", "huge"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "unknown scale 'huge'" in p.stderr
