"""Checkers of notebooks/27_data_pipeline.ipynb: its questions, a rank's reads of every global batch, and the
distributed sampler the learner builds on the ranks."""
import numpy as np

from ddlcourse import datapipe, sharding
from ddlcourse.exercises.solutions.data_pipeline import READER_VARIANTS, SAMPLER_VARIANTS
from ddlcourse.selfcheck import Verdict, code_exercise, exercise, told


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


_READER_HINTS = {
    "rank_seeded": "every rank must draw the SAME permutation: seed it with (seed, epoch), never with the rank",
    "epoch_ignored": "the order must change with the epoch: pass epoch to sharding.epoch_permutation "
                     "(the forgotten sampler.set_epoch)",
    "drop_last": "the last, smaller global batch is missing: nothing is dropped (use ceil, not floor)",
    "epoch_block": "you split the whole epoch among the ranks; split each GLOBAL BATCH, so that step i's "
                   "union over the ranks is the serial run's batch i",
    "strided": "you took every world_size-th sample; each rank's share is a contiguous slice of the batch",
    "last_rank_gets_rest": "the remainder went to the last rank; shares differ by at most one, the first "
                           "ranks take one more",
}


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
                for kind, hint in _READER_HINTS.items():
                    if got == _as_lists(READER_VARIANTS[kind](*args)):
                        return Verdict(False, hint)
                if len(got) != len(ref):
                    return Verdict(False, f"n={n}, global_batch={gb}: {len(got)} steps, expected {len(ref)} "
                                          "(one per global batch, the last one smaller)")
                return Verdict(False, f"n={n}, global_batch={gb}, rank {rank} of {ws}, epoch {epoch}: "
                                      f"step 0 reads {got[0][:6]}..., expected {ref[0][:6]}...")
    return Verdict(True)


# --------------------------------------------------------------------------- build it: a distributed sampler
# (n samples, drop_last): n that divides by 2 and 3, n that does not, n smaller than the world
_SAMPLER_CASES = [(11, False), (12, False), (2, False), (11, True), (12, True)]
_SAMPLER_EPOCHS = (0, 1, 2)
_SAMPLER_SEED = 5


_SAMPLER_HINTS = {
    "rank_seed": "the ranks' shares overlap and miss samples: every rank must draw the SAME permutation, "
                 "seeded with (seed, epoch) and never with the rank",
    "no_epoch": "every epoch gives the same order: put the epoch of set_epoch into the permutation's seed",
    "blocks": "rank r takes the indices r, r + world_size, r + 2 world_size, ... of the padded order "
              "(order[r::world_size], the rule of torch's DistributedSampler), not a contiguous block",
}
_SAMPLER_UNEQUAL = ("the ranks got different numbers of indices: pad the order to a multiple of world_size by "
                    "repeating its first samples (or cut it down with drop_last). In DDP the rank with fewer "
                    "batches stops early and the others wait for ever in their allreduce")


def _sampler_run(cls, n, rank, ws, drop_last):
    """(len(sampler), [its indices in each epoch]) for this rank."""
    s = cls(n, rank, ws, seed=_SAMPLER_SEED, drop_last=drop_last)
    epochs = []
    for e in _SAMPLER_EPOCHS:
        s.set_epoch(e)
        epochs.append([int(i) for i in s])
    return int(len(s)), epochs


def _sampler_ref(n, rank, ws, drop_last):
    """What :func:`_sampler_run` gives for torch's DistributedSampler over the epochs' permutations of
    ``sharding.epoch_permutation`` (the package's ``sharding.distributed_sampler_indices``)."""
    epochs = [sharding.distributed_sampler_indices(n, rank, ws, e, _SAMPLER_SEED, drop_last=drop_last,
                                                   order=sharding.epoch_permutation(n, e, _SAMPLER_SEED)).tolist()
              for e in _SAMPLER_EPOCHS]
    return len(epochs[0]), epochs


@code_exercise("distributed_sampler", distributed=True, ranks=(2, 3))
def check_distributed_sampler(cls, **_) -> Verdict:
    """On every rank: ``cls(n, rank, world_size, seed, drop_last)`` with ``set_epoch``, ``__len__`` and
    ``__iter__``. All ranks' indices are gathered and checked: equal lengths, the same permutation on every
    rank (disjoint shares that cover the data), a new order each epoch, and the reference's strided rule."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    comm = MPI.COMM_WORLD
    rank, ws = comm.Get_rank(), comm.Get_size()
    for n, drop_last in _SAMPLER_CASES:
        error, got = None, None
        try:
            got = _sampler_run(cls, n, rank, ws, drop_last)
        except Exception as e:          # raised after the others know, so that no rank waits for ever
            error = e
        elsewhere = told(error)
        if elsewhere is not None:
            return elsewhere
        every = comm.allgather(got)
        where = f"n={n}, world_size={ws}, drop_last={drop_last}"
        lengths = {len(idx) for _, epochs in every for idx in epochs} | {length for length, _ in every}
        if len(lengths) > 1:
            return Verdict(False, f"{where}: {_SAMPLER_UNEQUAL}")
        ref = [_sampler_ref(n, r, ws, drop_last) for r in range(ws)]
        if every == ref:
            continue
        for kind, hint in _SAMPLER_HINTS.items():
            if every == [_sampler_run(SAMPLER_VARIANTS[kind], n, r, ws, drop_last) for r in range(ws)]:
                return Verdict(False, f"{where}: {hint}")
        for e, epoch in enumerate(_SAMPLER_EPOCHS):
            seen = [i for _, epochs in every for i in epochs[e]]
            if len(set(seen)) != min(len(seen), n):
                return Verdict(False, f"{where}, epoch {epoch}: {_SAMPLER_HINTS['rank_seed']}")
        if n > 2 and all(every[r][1][0] == every[r][1][1] for r in range(ws)):
            return Verdict(False, f"{where}: {_SAMPLER_HINTS['no_epoch']}")
        total = ref[0][0] * ws
        return Verdict(False, f"{where}: rank {rank} read {got[1][0]} in epoch 0, expected {ref[rank][1][0]} "
                              f"(epoch_permutation(n, epoch, seed), padded or cut to {total}, then r::world_size)")
    return Verdict(True)
