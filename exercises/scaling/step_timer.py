"""Build it: my_time_step, the coding exercise 'step_timer' of notebooks/13_scaling.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise step_timer exercises/scaling/step_timer.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import numpy as np


def my_time_step(step, sync, clock, comm, warmup, repeats):
    """Seconds of one step, the same on every rank: per repetition the slowest rank's time, then the
    median over `repeats` repetitions, after `warmup` untimed steps. step() only queues work; sync() waits
    for it; clock() reads seconds; comm: an mpi4py communicator."""
    raise NotImplementedError   # exercise 4: your code here
