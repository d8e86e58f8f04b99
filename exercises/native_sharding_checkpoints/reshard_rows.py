"""Build it: my_reshard_rows, the coding exercise 'reshard_rows' of notebooks/26_native_sharding_checkpoints.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise reshard_rows exercises/native_sharding_checkpoints/reshard_rows.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import torch


def my_reshard_rows(paths, n_rows, rank, n_ranks):
    """Rows [start, stop) of a parameter held by `rank` of `n_ranks` (torch.chunk's rule), read from the old files.

    paths: the N old files in order; old file i holds the rows torch.chunk's rule gives rank i of N,
           as a tensor of shape (rows_i, cols).
    Returns a tensor of shape (stop - start, cols). Load only the old files that hold some of these rows.
    """
    raise NotImplementedError   # your code here
