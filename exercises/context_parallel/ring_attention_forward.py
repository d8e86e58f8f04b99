"""Build it: ring_attention_forward, the coding exercise 'ring_attention_forward' of notebooks/21_context_parallel.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise ring_attention_forward exercises/context_parallel/ring_attention_forward.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import torch
import torch.distributed as tdist


def ring_attention_forward(q, k, v):
    """Causal attention of this rank's queries over the whole sequence, K and V passed around the ring.

    Contiguous split: rank r holds tokens r*T ... (r+1)*T - 1 of a sequence of n_ranks*T tokens.
    q, k, v: (H, T, d), this rank's block (H heads, T tokens, head size d). Returns (H, T, d).
    """
    raise NotImplementedError   # your code here
