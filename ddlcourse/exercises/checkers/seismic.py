"""Checkers of labs/02_seismic.ipynb: the reference answers of its questions (its coding exercise, the halo
exchange, is notebook 18's: see :mod:`ddlcourse.exercises.checkers.tensor_spatial`)."""
import math

from ddlcourse.selfcheck import exercise


@exercise("seismic_activation_mb",
          "activations grow linearly with the voxels: bytes_per_voxel * depth * x * y, divided by 2**20 for MB")
def activation_mb(bytes_per_voxel: float, cube) -> float:
    d, x, y = cube
    return bytes_per_voxel * d * x * y / 2 ** 20


@exercise("seismic_min_spatial_ranks",
          "each of s ranks holds 1/s of the cube (ignore the halos): the smallest power of two s with "
          "need_mb / s <= budget_mb")
def min_spatial_ranks(need_mb: float, budget_mb: float) -> int:
    s = 1
    while need_mb / s > budget_mb:
        s *= 2
    return s


@exercise("seismic_halo_fraction",
          "a 3x3x3 convolution on a slab of depth L reads L + 2 slices: one halo slice from each neighbour")
def halo_fraction(slab_depth: int) -> float:
    return 2 / slab_depth


@exercise("ricker_zero_crossing",
          "w(t) = (1 - 2 (pi f t)^2) exp(-(pi f t)^2) is zero where 2 (pi f t)^2 = 1")
def ricker_zero_crossing(peak_freq: float) -> float:
    return 1 / (math.sqrt(2) * math.pi * peak_freq)
