"""Build it: moe_dispatch_combine, the coding exercise 'moe_dispatch_combine' of notebooks/22_expert_parallel.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise moe_dispatch_combine exercises/expert_parallel/moe_dispatch_combine.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import torch
import torch.distributed as tdist


def moe_dispatch_combine(x, expert_of, experts_per_rank, expert_fn):
    """Send each token to the rank that holds its expert, run the experts there, bring the results back.

    x: (n, d) this rank's tokens (n may differ from rank to rank); expert_of: (n,) int64, each token's expert
    (top-1), a global id in 0 .. n_ranks * experts_per_rank - 1; rank r holds experts r * experts_per_rank ...
    (r + 1) * experts_per_rank - 1. expert_fn(j, rows) runs this rank's local expert j on rows (m, d) -> (m, d).
    Returns (n, d): row i is the output of token i's expert on x[i], in the original order.
    """
    raise NotImplementedError   # your code here
