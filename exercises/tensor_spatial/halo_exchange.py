"""Build it: my_halo_exchange, the coding exercise 'halo_exchange' of notebooks/18_tensor_spatial.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise halo_exchange exercises/tensor_spatial/halo_exchange.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import torch


def my_halo_exchange(x, halo, rank, world, send, recv):
    """x: this rank's rows (N, C, R, W) -> (N, C, R + 2*halo, W), padded with the neighbours' rows."""
    raise NotImplementedError   # your code here
