"""test_plan_gpu_overheads: the runs of a lab's notebook set up on 4 ranks as the lab sets them up (training.setup:
the first k ranks of each scaling point, the dp x mp grid of each layout); rank 0 prints, as JSON, the sizes of the
rank lines through it that ddlcourse.grid made (one torch group each)."""
import json
import sys

from ddlcourse import dist, grid, training
from ddlcourse.cases import driving, seismic
from ddlcourse.tools import plan

section = sys.argv[1]
if section == "lab_seismic":
    runs = [(k, 1) for k in (None, 1, 2, 4)] + list(plan.SEISMIC_SPATIAL_RUNS)    # main, scaling, big cubes
    configs = [seismic.Config.make("smoke", backend="ddp", ranks=k, spatial=s) for k, s in runs]
    meshes = [(None, s) for _, s in runs]
else:
    layouts = [dict(ranks=k) for k in (None, 1, 2, 4)] + [dict(mp=mp, micro_batches=mp) for mp in plan.DRIVING_MESHES]
    configs = [driving.Config.make("smoke", backend="ddp", **kw) for kw in layouts]
    meshes = [(None, cfg.mp) for cfg in configs]
for cfg, mesh in zip(configs, meshes):
    training.setup(cfg, mesh=mesh)                        # collective: every rank, every run
lines = [len(line) for line in grid._TORCH["groups"] if 0 in line]
if dist.rank() == 0:
    print(json.dumps(lines))
dist.shutdown()
