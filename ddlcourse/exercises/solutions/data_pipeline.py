"""Reference solutions of notebooks/27_data_pipeline.ipynb: a rank's reads of every global batch, and a distributed
sampler; each with typical mistakes (what :mod:`ddlcourse.exercises.checkers.data_pipeline` must name)."""
import numpy as np

from ddlcourse import sharding
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- coding exercise: a rank's reads
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


READER_VARIANTS = {"rank_seeded": _rank_seeded, "epoch_ignored": _epoch_ignored, "drop_last": _drop_last,
                   "epoch_block": _epoch_block, "strided": _strided, "last_rank_gets_rest": _last_rank_gets_rest}


@reference("sharded_reader", mistakes=[
    (_rank_seeded, "every rank must draw the SAME permutation: seed it with (seed, epoch), never with the rank"),
    (_epoch_ignored, "the order must change with the epoch: pass epoch to sharding.epoch_permutation "
                     "(the forgotten sampler.set_epoch)"),
    (_drop_last, "the last, smaller global batch is missing: nothing is dropped (use ceil, not floor)"),
    (_epoch_block, "you split the whole epoch among the ranks; split each GLOBAL BATCH, so that step i's "
                   "union over the ranks is the serial run's batch i"),
    (_strided, "you took every world_size-th sample; each rank's share is a contiguous slice of the batch"),
    (_last_rank_gets_rest, "the remainder went to the last rank; shares differ by at most one, the first "
                           "ranks take one more"),
])
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


# --------------------------------------------------------------------------- build it: a distributed sampler
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


SAMPLER_VARIANTS = {kind: _sampler_variant(kind) for kind in ("rank_seed", "no_pad", "no_epoch", "blocks")}

reference("distributed_sampler", mistakes=[
    (SAMPLER_VARIANTS["rank_seed"], "the SAME permutation"), (SAMPLER_VARIANTS["no_pad"], "pad the order"),
    (SAMPLER_VARIANTS["no_epoch"], "put the epoch of set_epoch"),
    (SAMPLER_VARIANTS["blocks"], "not a contiguous block")])(_SamplerSolution)
