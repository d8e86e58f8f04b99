"""Build it: MySampler, the coding exercise 'distributed_sampler' of notebooks/27_data_pipeline.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise distributed_sampler exercises/data_pipeline/distributed_sampler.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import numpy as np
import torch


class MySampler:
    """Rank `rank`'s indices of a data set of `n` samples, as torch's DistributedSampler gives them."""

    def __init__(self, n, rank, world_size, seed=0, drop_last=False):
        raise NotImplementedError   # your code here: keep the arguments, start at epoch 0

    def set_epoch(self, epoch):
        raise NotImplementedError   # your code here

    def __len__(self):
        raise NotImplementedError   # your code here: indices per rank, the same on every rank

    def __iter__(self):
        raise NotImplementedError   # your code here: permutation, pad or cut, then every world_size-th index
