"""Two classic bugs at scale, on real ranks against serial (issue 27's two lessons):

* gradient clipping of a tensor + sequence parallel block: ``clip_grad_norm_`` on a rank's own parameters, or the
  squared norms of all its parameters summed over the ranks, clip differently from the serial model; the shards'
  squared norms summed over the ranks with the replicated weights counted once (``sequence.clip_grad_norm_tp``)
  give the serial norm and the serial clipped gradients;
* a dynamic loss scaler over sharded gradients: with ``torch.amp.GradScaler`` per rank the rank that overflowed
  skips a step the others take; ``ShardedGradScaler`` (found_inf all-reduced) skips it on every rank."""
import pytest

from helpers import run_ranks

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [2, 3])
def test_clipping_a_tensor_parallel_block_equals_serial_only_with_the_global_norm(n):
    run_ranks(n, "sharded_clipping_tensor_parallel")


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank_only_with_the_sharded_scaler():
    run_ranks(2, "sharded_clipping_scaler_overflow")
