"""Build it: my_zero1_step, the coding exercise 'zero1_step' of notebooks/19_sharded_data_parallel.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise zero1_step exercises/sharded_data_parallel/zero1_step.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import numpy as np


def my_zero1_step(params, owner, rank, world, optimizer):
    """One ZeRO-1 step on this rank, after loss.backward() on this rank's share of the batch."""
    import torch
    import torch.distributed as tdist
    raise NotImplementedError   # your code here
