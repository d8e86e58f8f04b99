"""Spatial parallelism (halo exchange, SpatialConv2d/3d) against the serial layers, forward and backward."""
import pytest

CODE = """
import torch
from ddlcourse import dist
from ddlcourse.parallel import spatial
from ddlcourse.experiments import spatial as spatial_exp
from mpi4py import MPI
dist.init()
res = []
for ndim, dim, k, dil, size in [(2, 2, 3, 1, 16), (2, 3, 5, 1, 16), (2, 2, 3, 2, 16), (3, 2, 3, 1, 8), (3, 4, 3, 1, 8)]:
    res.append(spatial_exp.compare_with_serial(ndim=ndim, size=size, kernel=k, dim=dim, dilation=dil))
worst = max(max(r.values()) for r in res)
worst = MPI.COMM_WORLD.allreduce(worst, op=MPI.MAX)
if dist.rank() == 0:
    print("WORST", worst)
dist.shutdown()
"""


@pytest.mark.parametrize("n", [2, 4])
def test_spatial_conv_matches_serial(mpi, n):
    p = mpi(n, CODE)
    worst = float(p.stdout.split("WORST")[1].split()[0])
    assert worst < 1e-4, p.stdout


def test_spatial_conv_rejects_bad_conv():
    from torch import nn
    from ddlcourse.parallel.spatial import SpatialConv2d
    with pytest.raises(ValueError):
        SpatialConv2d(nn.Conv2d(1, 1, 3, padding=1, stride=2))
    with pytest.raises(ValueError):
        SpatialConv2d(nn.Conv2d(1, 1, 4, padding=2))
    with pytest.raises(ValueError):
        SpatialConv2d(nn.Conv3d(1, 1, 3, padding=1))
