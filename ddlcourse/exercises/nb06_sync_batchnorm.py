"""Exercises of notebooks/06_sync_batchnorm.ipynb."""
import math

from ddlcourse.selfcheck import exercise


@exercise("bn_values_per_stat", "a 2D batch norm averages over the batch and both spatial dimensions; "
          "SyncBatchNorm over all ranks' batches")
def bn_values_per_stat(micro_batch: int, height: int, width: int, world_size: int) -> int:
    return micro_batch * height * width * world_size


@exercise("syncbn_floats_per_layer", "forward: [count, C sums], then C squared deviations; backward: "
          "sum(dy) and sum(dy*xhat), C each")
def syncbn_floats_per_layer(channels: int) -> int:
    return (channels + 1) + channels + 2 * channels


@exercise("noise_ratio", "the standard error of a mean shrinks like 1/sqrt(batch)")
def noise_ratio(small: int, large: int) -> float:
    return math.sqrt(large / small)
