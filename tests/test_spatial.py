"""Spatial parallelism (halo exchange, SpatialConv2d/3d) against the serial layers, forward and backward."""
import pytest

from helpers import run_ranks


@pytest.mark.parametrize("n", [2, 4])
def test_spatial_conv_matches_serial(n):
    p = run_ranks(n, "spatial_conv_vs_serial")
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
