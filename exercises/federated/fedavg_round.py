"""Build it: fedavg_round, the coding exercise 'fedavg_round' of notebooks/10_federated.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise fedavg_round exercises/federated/fedavg_round.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import torch
from torch import nn


def fedavg_round(model, global_params, X, Y, local_epochs, lr, batch_size, allreduce):
    """One FedAvg round on this client. model: nn.Module (stale parameters); global_params: (P,) flat tensor;
    X: (n_k, 16), Y: (n_k,); allreduce(t) sums t over the clients in place. Returns (P,): sum_k (n_k / n) w_k."""
    raise NotImplementedError   # your code here
