"""Exercises of notebooks/14_data_pipeline.ipynb."""
import numpy as np

from ddlcourse import datapipe, sharding
from ddlcourse.selfcheck import Verdict, code_exercise, exercise


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


# --------------------------------------------------------------------------- coding exercise: a rank's reads
# (n samples, global batch, world size): uneven last batch, batches that do not divide by the ranks
_READER_CASES = [(103, 16, 3), (64, 10, 4), (50, 50, 2)]
_SEED = 7


def _as_lists(batches) -> list[list[int]]:
    return [[int(i) for i in np.asarray(b).ravel()] for b in batches]


def _rank_seeded(n, gb, rank, ws, epoch, seed):       # every rank draws its own permutation
    order = sharding.epoch_permutation(n, epoch, seed + rank)
    return [sharding.shard(order[i:i + gb], rank, ws) for i in range(0, n, gb)]


def _epoch_ignored(n, gb, rank, ws, epoch, seed):     # the same order every epoch (no set_epoch)
    return sharding.sharded_batches(n, gb, rank, ws, 0, seed)


def _drop_last(n, gb, rank, ws, epoch, seed):         # floor: the last, smaller global batch is dropped
    return sharding.sharded_batches(n, gb, rank, ws, epoch, seed, drop_last=True)


def _epoch_block(n, gb, rank, ws, epoch, seed):       # a block of the whole epoch, cut into local batches
    mine = sharding.shard(sharding.epoch_permutation(n, epoch, seed), rank, ws)
    per = len(sharding.shard(np.arange(gb), rank, ws)) or 1
    return [mine[i:i + per] for i in range(0, len(mine), per)]


def _strided(n, gb, rank, ws, epoch, seed):           # every ws-th sample of each global batch
    return [b[rank::ws] for b in sharding.global_batches(n, gb, epoch, seed)]


def _last_rank_gets_rest(n, gb, rank, ws, epoch, seed):  # equal shares, the remainder all to the last rank
    out = []
    for b in sharding.global_batches(n, gb, epoch, seed):
        per = len(b) // ws
        out.append(b[rank * per:] if rank == ws - 1 else b[rank * per:(rank + 1) * per])
    return out


_READER_MISTAKES = [
    (_rank_seeded, "every rank must draw the SAME permutation: seed it with (seed, epoch), never with the rank"),
    (_epoch_ignored, "the order must change with the epoch: pass epoch to sharding.epoch_permutation "
                     "(the forgotten sampler.set_epoch)"),
    (_drop_last, "the last, smaller global batch is missing: nothing is dropped (use ceil, not floor)"),
    (_epoch_block, "you split the whole epoch among the ranks; split each GLOBAL BATCH, so that step i's "
                   "union over the ranks is the serial run's batch i"),
    (_strided, "you took every world_size-th sample; each rank's share is a contiguous slice of the batch"),
    (_last_rank_gets_rest, "the remainder went to the last rank; shares differ by at most one, the first "
                           "ranks take one more"),
]


@code_exercise("sharded_reader")
def check_sharded_reader(fn) -> Verdict:
    """``fn(n, global_batch, rank, world_size, epoch, seed)`` -> this rank's index array for every step."""
    for n, gb, ws in _READER_CASES:
        for epoch in (0, 1):
            for rank in range(ws):
                args = (n, gb, rank, ws, epoch, _SEED)
                got = _as_lists(fn(*args))
                ref = _as_lists(sharding.sharded_batches(*args))
                if got == ref:
                    continue
                for wrong, hint in _READER_MISTAKES:
                    if got == _as_lists(wrong(*args)):
                        return Verdict(False, hint)
                if len(got) != len(ref):
                    return Verdict(False, f"n={n}, global_batch={gb}: {len(got)} steps, expected {len(ref)} "
                                          "(one per global batch, the last one smaller)")
                return Verdict(False, f"n={n}, global_batch={gb}, rank {rank} of {ws}, epoch {epoch}: "
                                      f"step 0 reads {got[0][:6]}..., expected {ref[0][:6]}...")
    return Verdict(True)
