"""Exercises of notebooks/12_tensor_spatial_sharded.ipynb."""
from ddlcourse.selfcheck import exercise


@exercise("zero2_bytes_per_param", "parameters stay whole (4 bytes); gradients (4) and Adam state (8) are split over N")
def zero2_bytes_per_param(world_size: int) -> float:
    return 4 + 12 / world_size


@exercise("halo_rows", "a kernel of size k with dilation d reaches d*(k-1)/2 rows to each side")
def halo_rows(kernel: int, dilation: int) -> int:
    return dilation * (kernel - 1) // 2
