"""Build it: MySyncBatchNorm, the coding exercise 'syncbn_function' of notebooks/11_sync_batchnorm.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise syncbn_function exercises/sync_batchnorm/syncbn_function.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import numpy as np
import torch
from torch import nn


class MySyncBatchNorm(torch.autograd.Function):
    """Batch norm over the images of all ranks: y = MySyncBatchNorm.apply(x, weight, bias, eps, allreduce)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, allreduce):
        """x: (m, C, H, W) this rank's images; weight, bias: (C,) -> y: (m, C, H, W), normalised with the
        mean and biased variance of all ranks' images."""
        raise NotImplementedError   # exercise 5: one allreduce of [count, C sums, C sums of squares]

    @staticmethod
    def backward(ctx, dy):
        """dy: (m, C, H, W) -> (dx (m, C, H, W), dweight (C,), dbias (C,), None, None); dweight and dbias are
        this rank's own sums."""
        raise NotImplementedError   # exercise 5: all-reduce sum(dy) and sum(dy * xhat), then dx
