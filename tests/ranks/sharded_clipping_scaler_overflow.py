"""test_sharded_clipping_and_scaler: an overflow on rank 1 skips the step there only with GradScaler, and on
every rank with ShardedGradScaler; asserts on every rank."""
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
