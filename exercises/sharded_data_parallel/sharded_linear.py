"""Build it: MyShardedLinear, the coding exercise 'sharded_linear' of notebooks/19_sharded_data_parallel.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise sharded_linear exercises/sharded_data_parallel/sharded_linear.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import numpy as np
import torch
import torch.distributed as tdist


class MyShardedLinear(torch.nn.Module):
    """A Linear(in, out) layer whose parameters are sharded over the ranks (ZeRO-3 / FSDP).

    weight (out, in), bias (out,): the same full values on every rank. P = out*in + out.
    self.shard: this rank's piece of [weight.flatten(), bias] padded to a multiple of world, ceil(P / world) numbers.
    forward: x (batch, in) -> (batch, out).
    """

    class Gathered(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, shard, layer):
            """All-gather the pieces, drop the padding, return x @ w.T + b; save x and the shard, not w."""
            raise NotImplementedError   # your code here

        @staticmethod
        def backward(ctx, grad_out):
            """Gather w again; return grad_out @ w, this rank's piece of the mean flat gradient, None."""
            raise NotImplementedError   # your code here

    def __init__(self, weight, bias, rank, world):
        super().__init__()
        raise NotImplementedError       # your code here: keep only self.shard (and the sizes you need)

    def forward(self, x):
        return self.Gathered.apply(x, self.shard, self)
