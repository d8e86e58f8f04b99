"""Build it: sh_on_ranks, the coding exercise 'sh_on_ranks' of notebooks/28_hyperparameter_search.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise sh_on_ranks exercises/hyperparameter_search/sh_on_ranks.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import torch


def sh_on_ranks(trials, objective, min_budget, eta, comm):
    """Successive halving with each rung's trials shared among the ranks of `comm`.
    trials: list of ids; objective(trial, budget) -> val_loss. Returns [(budget, sorted ids), ...], one per rung."""
    rank, size = comm.Get_rank(), comm.Get_size()
    raise NotImplementedError   # your code here
