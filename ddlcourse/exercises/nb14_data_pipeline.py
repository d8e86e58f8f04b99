"""Exercises of notebooks/14_data_pipeline.ipynb."""
from ddlcourse import datapipe
from ddlcourse.selfcheck import exercise


@exercise("loop_time_no_overlap", "without workers the loop loads a batch, then computes: the two times add up")
def loop_time_no_overlap(loader_s: float, step_s: float) -> float:
    return loader_s + step_s


@exercise("loop_time_prefetch", "with enough workers prefetching, loading hides behind the step: the slower of the two sets the pace")
def loop_time_prefetch(loader_s: float, step_s: float) -> float:
    return max(loader_s, step_s)


@exercise("rank_samples", "every rank gets n // world_size contiguous samples; rank r starts at r * (n // world_size)")
def rank_samples(n: int, rank: int, world_size: int) -> tuple[int, int]:
    return datapipe.rank_range(n, rank, world_size)


@exercise("shards_read", "a rank opens every shard that overlaps [start, stop): count the shard ids from start // sps to (stop - 1) // sps")
def shards_read(n: int, rank: int, world_size: int, samples_per_shard: int) -> int:
    start, stop = datapipe.rank_range(n, rank, world_size)
    return (stop - 1) // samples_per_shard - start // samples_per_shard + 1
