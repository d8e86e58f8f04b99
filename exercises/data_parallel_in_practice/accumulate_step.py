"""Build it: my_accumulate_step, the coding exercise 'accumulate_step' of notebooks/06_data_parallel_in_practice.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise accumulate_step exercises/data_parallel_in_practice/accumulate_step.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import numpy as np
import torch
import torch.nn.functional as F


def my_accumulate_step(ddp_model, micro_batches, optimizer, loss_fn):
    """One optimizer step of ``ddp_model`` (a DistributedDataParallel) on this rank's share of the global batch,
    ``micro_batches``: k (x, y) pairs of equal size. Only the last backward all-reduces; the step equals one step
    on the whole global batch. Returns this rank's mean loss over its micro-batches (a float)."""
    import contextlib
    raise NotImplementedError   # exercise 3: zero_grad, k backward passes (no_sync for all but the last), one step
