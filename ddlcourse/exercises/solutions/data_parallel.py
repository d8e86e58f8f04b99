"""Reference solutions of notebooks/05_data_parallel.ipynb (and of labs/01_maize.ipynb, which trains with MyDDP): the
gradient-averaging hook and MyDDP as a learner writes them, and each with one typical mistake (what their checkers,
:mod:`ddlcourse.exercises.checkers.data_parallel`, must name)."""
import torch
import torch.distributed as tdist

from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- coding exercise: the gradient hook
def _hook_sum(p):
    """Mistake: sums the gradients over the ranks and forgets to divide."""
    import torch.distributed as tdist
    tdist.all_reduce(p.grad, op=tdist.ReduceOp.SUM)


def _hook_local(p):
    """Mistake: divides by the number of ranks but never communicates."""
    import torch.distributed as tdist
    p.grad.div_(tdist.get_world_size())


def _hook_params(p):
    """Mistake: all-reduces the parameter (p.data) instead of its gradient, then divides the gradient."""
    import torch.distributed as tdist
    tdist.all_reduce(p.data, op=tdist.ReduceOp.SUM)
    p.data.div_(tdist.get_world_size())


HOOK_VARIANTS = {"sum": _hook_sum, "local": _hook_local, "params": _hook_params}


def _average_grad_hook_solution(p):
    """p.grad <- mean of p.grad over the ranks, in place."""
    import torch.distributed as tdist
    tdist.all_reduce(p.grad, op=tdist.ReduceOp.SUM)
    p.grad.div_(tdist.get_world_size())


reference("average_grad_hook", mistakes=[
    (_hook_sum, "you summed the gradients"), (_hook_local, "never communicated"),
    (_hook_params, "p.data")])(_average_grad_hook_solution)


# --------------------------------------------------------------------------- build it: DDP from scratch
class MyDDP(torch.nn.Module):
    """Data parallelism the way DDP does it: broadcast, buckets, hooks that start an asynchronous allreduce
    per full bucket during backward, and a wait for all of them before the optimizer steps."""

    def __init__(self, module, bucket_cap_mb=25, group=None):
        super().__init__()
        self.module, self.group = module, group
        self.world = tdist.get_world_size(group)
        params = [p for p in module.parameters() if p.requires_grad]
        with torch.no_grad():
            for p in params:                                  # every rank starts from rank 0's parameters
                tdist.broadcast(p.data, src=0, group=group)
        cap = bucket_cap_mb * 1024 * 1024                     # bytes
        self.buckets, bucket, size = [], [], 0
        for p in reversed(params):                            # backward makes the last layers' gradients first
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                self.buckets.append(bucket)
                bucket, size = [], 0
        if bucket:                                            # the last bucket, not full
            self.buckets.append(bucket)
        self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self.ready = [0] * len(self.buckets)
        self.pending = {}                                     # bucket -> (handle, flat buffer)
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _grad_ready(self, p):
        i = self.bucket_of[p]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):             # the bucket is full: start its allreduce
            self._launch(i)

    def _launch(self, i):
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                          for p in self.buckets[i]])
        self.pending[i] = (tdist.all_reduce(flat, group=self.group, async_op=True), flat)

    def finish_gradient_synchronization(self):
        for i in range(len(self.buckets)):
            if i not in self.pending:                         # a parameter got no gradient: send zeros for it
                self._launch(i)
        for i, (handle, flat) in self.pending.items():
            handle.wait()
            flat /= self.world
            offset = 0
            for p in self.buckets[i]:
                if p.grad is not None:
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.pending.clear()
        self.ready = [0] * len(self.buckets)


def _ddp_variant(broadcast=True, mean=True, wait_in_hook=False, launch_in_hook=True, last_bucket=True,
                 zeros_for_unused=True, reset_counts=True, per_parameter=False, forward_order=False):
    """MyDDP with one typical mistake (each flag off, or on, gives one)."""

    class Variant(torch.nn.Module):
        def __init__(self, module, bucket_cap_mb=25, group=None):
            super().__init__()
            self.module, self.group = module, group
            self.world = tdist.get_world_size(group)
            params = [p for p in module.parameters() if p.requires_grad]
            if broadcast:
                with torch.no_grad():
                    for p in params:
                        tdist.broadcast(p.data, src=0, group=group)
            cap = 0 if per_parameter else bucket_cap_mb * 1024 * 1024     # cap 0: a bucket per parameter
            self.buckets, bucket, size = [], [], 0
            for p in (params if forward_order else reversed(params)):
                bucket.append(p)
                size += p.numel() * p.element_size()
                if size >= cap:
                    self.buckets.append(bucket)
                    bucket, size = [], 0
            if bucket and last_bucket:
                self.buckets.append(bucket)
            self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
            self.ready = [0] * len(self.buckets)
            self.pending = {}
            for p in self.bucket_of:
                p.register_post_accumulate_grad_hook(self._grad_ready)

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

        def _grad_ready(self, p):
            i = self.bucket_of[p]
            self.ready[i] += 1
            if self.ready[i] == len(self.buckets[i]) and launch_in_hook:
                self._launch(i)
                if wait_in_hook:
                    self.pending[i][0].wait()

        def _launch(self, i):
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                              for p in self.buckets[i]])
            self.pending[i] = (tdist.all_reduce(flat, group=self.group, async_op=True), flat)

        def finish_gradient_synchronization(self):
            for i in range(len(self.buckets)):
                if i not in self.pending and (zeros_for_unused or not launch_in_hook):
                    self._launch(i)
            for i, (handle, flat) in self.pending.items():
                handle.wait()
                if mean:
                    flat /= self.world
                offset = 0
                for p in self.buckets[i]:
                    if p.grad is not None:
                        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
            self.pending.clear()
            if reset_counts:
                self.ready = [0] * len(self.buckets)

    return Variant


reference("my_ddp", mistakes=[
    (_ddp_variant(broadcast=False), "the ranks start from different parameters"),
    (_ddp_variant(mean=False), "you summed the gradients"),
    (_ddp_variant(wait_in_hook=True), "waits for its bucket's allreduce during backward"),
    (_ddp_variant(launch_in_hook=False), "no allreduce starts during backward"),
    (_ddp_variant(last_bucket=False), "were never all-reduced"),
    (_ddp_variant(zeros_for_unused=False), "gets no gradient"),
    (_ddp_variant(reset_counts=False), "never reset"),
    (_ddp_variant(per_parameter=True), "one allreduce per parameter"),
    (_ddp_variant(forward_order=True), "in forward order"),
])(MyDDP)
