"""Exercises of notebooks/05_data_parallel.ipynb."""
from ddlcourse.selfcheck import exercise


@exercise("global_batch", "every rank processes its own micro-batch in each step")
def global_batch(micro_batch: int, world_size: int) -> int:
    return micro_batch * world_size


@exercise("fp16_bytes_saved", "float32 takes 4 bytes per number, float16 takes 2")
def fp16_bytes_saved(n_params: int) -> int:
    return 2 * n_params


@exercise("linear_scaled_lr", "linear scaling (Goyal et al. 2017): lr grows by the same factor as the global batch")
def linear_scaled_lr(base_lr: float, base_batch: int, global_batch: int) -> float:
    return base_lr * global_batch / base_batch
