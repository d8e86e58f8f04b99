"""Exercises of notebooks/27_data_pipeline.ipynb."""
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


def _reader_solution(n, global_batch, rank, world_size, epoch, seed):
    """This rank's share of every global batch, as a learner writes it."""
    order = sharding.epoch_permutation(n, epoch, seed)      # the same permutation on every rank
    out = []
    for start in range(0, n, global_batch):                  # ceil: the last, smaller batch is kept
        batch = order[start:start + global_batch]
        base, extra = divmod(len(batch), world_size)
        lo = rank * base + min(rank, extra)                  # the first `extra` ranks take one more
        out.append(batch[lo:lo + base + (rank < extra)])
    return out


@code_exercise("sharded_reader", solution=_reader_solution, mistakes=_READER_MISTAKES)
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


# --------------------------------------------------------------------------- build it: a distributed sampler
# (n samples, drop_last): n that divides by 2 and 3, n that does not, n smaller than the world
_SAMPLER_CASES = [(11, False), (12, False), (2, False), (11, True), (12, True)]
_SAMPLER_EPOCHS = (0, 1, 2)
_SAMPLER_SEED = 5


class _SamplerSolution:
    """Shuffle with (seed, epoch), pad (repeat the first samples) or drop to a multiple of world_size, then
    rank r takes the indices r, r + world_size, ... (the rule of torch's DistributedSampler)."""

    def __init__(self, n, rank, world_size, seed=0, drop_last=False):
        self.n, self.rank, self.world_size = n, rank, world_size
        self.seed, self.drop_last, self.epoch = seed, drop_last, 0
        if drop_last:
            self.total = (n // world_size) * world_size       # the tail is not seen this epoch
        else:
            self.total = -(-n // world_size) * world_size     # ceil to a multiple of world_size

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.total // self.world_size

    def __iter__(self):
        order = sharding.epoch_permutation(self.n, self.epoch, self.seed)   # the same on every rank
        if self.drop_last:
            order = order[:self.total]
        else:
            order = np.concatenate([order, np.resize(order, self.total - self.n)])   # repeat the first ones
        return iter(order[self.rank:self.total:self.world_size].tolist())


def _sampler_variant(kind: str):
    """A sampler class with one typical mistake."""
    class Wrong(_SamplerSolution):
        def __iter__(self):
            seed = self.seed + self.rank if kind == "rank_seed" else self.seed
            epoch = 0 if kind == "no_epoch" else self.epoch
            order = sharding.epoch_permutation(self.n, epoch, seed)
            if kind == "no_pad":
                return iter(order[self.rank::self.world_size].tolist())
            if self.drop_last:
                order = order[:self.total]
            else:
                order = np.concatenate([order, np.resize(order, self.total - self.n)])
            if kind == "blocks":
                per = self.total // self.world_size
                return iter(order[self.rank * per:(self.rank + 1) * per].tolist())
            return iter(order[self.rank:self.total:self.world_size].tolist())

        def __len__(self):
            return len(list(iter(self))) if kind == "no_pad" else super().__len__()
    Wrong.__name__ = f"sampler_{kind}"
    return Wrong


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


@code_exercise("distributed_sampler", distributed=True, solution=_SamplerSolution, ranks=(2, 3), mistakes=[
    (_sampler_variant("rank_seed"), "the SAME permutation"), (_sampler_variant("no_pad"), "pad the order"),
    (_sampler_variant("no_epoch"), "put the epoch of set_epoch"), (_sampler_variant("blocks"), "not a contiguous block")])
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
        errors = comm.allgather(error is not None)
        if error is not None:
            raise error
        if any(errors):
            return Verdict(False, "your sampler raised on another rank")
        every = comm.allgather(got)
        where = f"n={n}, world_size={ws}, drop_last={drop_last}"
        lengths = {len(idx) for _, epochs in every for idx in epochs} | {length for length, _ in every}
        if len(lengths) > 1:
            return Verdict(False, f"{where}: {_SAMPLER_UNEQUAL}")
        ref = [_sampler_run(_SamplerSolution, n, r, ws, drop_last) for r in range(ws)]
        if every == ref:
            continue
        for kind, hint in _SAMPLER_HINTS.items():
            if every == [_sampler_run(_sampler_variant(kind), n, r, ws, drop_last) for r in range(ws)]:
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
