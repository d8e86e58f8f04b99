"""Build it: MyDDP, the coding exercise 'my_ddp' of notebooks/05_data_parallel.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise my_ddp exercises/data_parallel/my_ddp.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import numpy as np
import torch
import torch.distributed as tdist


class MyDDP(torch.nn.Module):
    """Data-parallel ``module`` over the ranks of ``group`` (None: all), with gradient buckets, like DDP.

    net = MyDDP(model, bucket_cap_mb=25)
    loss = loss_fn(net(x), y); loss.backward()      # the hooks start one async allreduce per full bucket
    net.finish_gradient_synchronization()           # wait for all of them: .grad = mean over the ranks
    opt.step()
    """

    def __init__(self, module, bucket_cap_mb=25, group=None):
        super().__init__()
        self.module = module
        raise NotImplementedError   # exercise 5: broadcast, buckets in reverse order, a hook on each parameter

    def forward(self, *args, **kwargs):
        """The wrapped module's forward, unchanged."""
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        """Wait for every bucket's allreduce, divide by the world size, copy back into each p.grad."""
        raise NotImplementedError
