"""Build it: my_train_with_checkpoints, the coding exercise 'train_with_checkpoints' of notebooks/25_fault_tolerance.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise train_with_checkpoints exercises/fault_tolerance/train_with_checkpoints.py

The checker loads the whole file, so helper functions you write here come with it.
"""
import torch


def my_train_with_checkpoints(model, opt, step_fn, n_steps, ckpt_dir, every):
    """Run steps 0 .. n_steps - 1 with step_fn(model, opt, step) -> loss, resuming and checkpointing in ckpt_dir.

    On start: resume from the latest complete step_<N>.pt (model, optimizer, RNG state) at step N, else step 0.
    After every `every` steps: save step_<N>.pt (N = steps done) atomically: a .tmp file, then os.replace.
    """
    raise NotImplementedError   # your code here
