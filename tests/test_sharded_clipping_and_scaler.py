"""Two classic bugs at scale, on real ranks against serial (issue 27's two lessons):

* gradient clipping of a tensor + sequence parallel block: ``clip_grad_norm_`` on a rank's own parameters, or the
  squared norms of all its parameters summed over the ranks, clip differently from the serial model; the shards'
  squared norms summed over the ranks with the replicated weights counted once (``sequence.clip_grad_norm_tp``)
  give the serial norm and the serial clipped gradients;
* a dynamic loss scaler over sharded gradients: with ``torch.amp.GradScaler`` per rank the rank that overflowed
  skips a step the others take; ``ShardedGradScaler`` (found_inf all-reduced) skips it on every rank."""
import pytest

pytestmark = pytest.mark.mpi

CLIP = """
import torch.distributed as tdist
from ddlcourse import dist
from ddlcourse.parallel import sequence
from ddlcourse.experiments import sequence as sequence_exp
from ddlcourse.models import transformer as T
dist.init()
t = tdist.get_world_size()
d = sequence_exp.clipping_on_shards(T.TransformerConfig(vocab=11, seq_len=4 * t, dim=16 * t, n_heads=2 * t, n_layers=1))
assert d["right"]["grad_diff"] < 1e-6 and abs(d["right"]["norm"] - d["serial_norm"]) < 1e-5 * d["serial_norm"], d
assert d["local"]["grad_diff"] > 1e-4 and d["local"]["norm"] < d["serial_norm"], d      # its own shards only
assert d["summed"]["grad_diff"] > 1e-4 and d["summed"]["norm"] > d["serial_norm"], d    # replicated ones t times
norms = [None] * t
tdist.all_gather_object(norms, d["local"]["norm"])
assert len(set(norms)) == t, norms                                                     # a factor per rank
dist.shutdown()   # before exit: gloo may abort at interpreter exit with a live process group
"""

SCALER = """
import torch.distributed as tdist
from ddlcourse import amp, dist
dist.init()
d = amp.sharded_scaler(steps=5, overflow_step=2, overflow_rank=1)
every = [None] * tdist.get_world_size()
tdist.all_gather_object(every, d)
plain = [e["GradScaler"]["taken"] for e in every]
assert plain[1][2] is False and plain[0][2] is True, plain                  # only the overflowing rank skipped
assert every[0]["GradScaler"]["scales"][-1] != every[1]["GradScaler"]["scales"][-1]
sharded = [e["ShardedGradScaler"]["taken"] for e in every]
assert all(s == [True, True, False, True, True] for s in sharded), sharded   # every rank skipped step 2
assert len({tuple(e["ShardedGradScaler"]["scales"]) for e in every}) == 1
dist.shutdown()
"""


@pytest.mark.parametrize("n", [2, 3])
def test_clipping_a_tensor_parallel_block_equals_serial_only_with_the_global_norm(mpi, n):
    mpi(n, CLIP)


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank_only_with_the_sharded_scaler(mpi):
    mpi(2, SCALER)
