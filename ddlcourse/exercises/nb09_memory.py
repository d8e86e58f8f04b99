"""Exercises of notebooks/09_memory.ipynb."""
from ddlcourse.selfcheck import exercise


@exercise("adam_state_gib", "fp32 Adam: 4 bytes of weights + 4 of gradients + 8 of moments per parameter; 1 GiB = 2**30 bytes")
def adam_state_gib(n_params: float) -> float:
    return 16 * n_params / 2**30


@exercise("activation_mib", "batch * channels * side**3 values, 4 bytes each; 1 MiB = 2**20 bytes")
def activation_mib(channels: int, side: int, batch: int) -> float:
    return batch * channels * side**3 * 4 / 2**20
