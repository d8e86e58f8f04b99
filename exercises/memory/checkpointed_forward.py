"""Build it: my_checkpointed_forward, the coding exercise 'checkpointed_forward' of notebooks/14_memory.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise checkpointed_forward exercises/memory/checkpointed_forward.py

The checker loads the whole file, so helper functions you write here come with it.
"""
import torch


def my_checkpointed_forward(layers, x, segments):
    """Run nn.Sequential `layers` on x (batch, dim) in `segments` checkpointed chunks; return the output (batch, out).

    Chunk k holds the layers k * L // segments up to, not including, (k + 1) * L // segments (L = len(layers)).
    Only each chunk's input is kept for backward; backward recomputes the chunk from it.
    """
    raise NotImplementedError   # your code here
