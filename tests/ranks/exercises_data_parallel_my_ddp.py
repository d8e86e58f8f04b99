"""test_exercises_data_parallel: a MyDDP with another bucketing rule passes; one that forgets to reset its counts,
and one that all-reduces each bucket synchronously, are named."""
from tests.ranks._on_ranks import finish, reject, run_checker

import torch
import torch.distributed as tdist
from ddlcourse.exercises.checkers.data_parallel import _DDP_EARLY
from ddlcourse.exercises.solutions import data_parallel as ex

class Greedy(ex.MyDDP):
    """Another bucketing rule, also right: close a bucket *before* the parameter that would overflow it."""
    def __init__(self, module, bucket_cap_mb=25, group=None):
        super().__init__(module, bucket_cap_mb, group)
        cap, buckets, b, size = bucket_cap_mb * 2**20, [], [], 0
        for p in reversed([p for p in module.parameters() if p.requires_grad]):
            nbytes = p.numel() * p.element_size()
            if b and size + nbytes > cap:
                buckets.append(b)
                b, size = [], 0
            b.append(p)
            size += nbytes
        buckets.append(b)
        self.buckets = buckets
        self.bucket_of = {p: i for i, bb in enumerate(buckets) for p in bb}
        self.ready = [0] * len(buckets)
v = run_checker("my_ddp", Greedy)
assert v.ok, v.message

class NoReset(ex._ddp_variant(zeros_for_unused=False)):
    """Forgets to reset the counts: from the second step on, no bucket is ever full again."""
    def finish_gradient_synchronization(self):
        ready = list(self.ready)
        super().finish_gradient_synchronization()
        self.ready = ready
reject("my_ddp", NoReset, "reset the per-bucket counts")

class Blocking(ex.MyDDP):
    """Starts each bucket's allreduce with async_op=False."""
    def _launch(self, i):
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in self.buckets[i]])
        tdist.all_reduce(flat, group=self.group)
        class Done:
            def wait(self):
                pass
        self.pending[i] = (Done(), flat)
reject("my_ddp", Blocking, _DDP_EARLY)

finish()
