"""Build it: stage_1f1b, the coding exercise 'pipeline_1f1b' of notebooks/16_pipeline.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise pipeline_1f1b exercises/pipeline/pipeline_1f1b.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""


def stage_1f1b(stage, inputs, targets, loss_fn, rank, world, num_micro_batches, send, recv):
    """One 1F1B training step of stage `rank` of `world`; the gradients accumulate in `stage`.

    inputs: on rank 0 a list of m tensors (micro_batch_i, features), else None.
    targets: on the last rank a list of m label tensors (micro_batch_i,), else None.
    send(t, dst): sends tensor t to rank dst. recv(src): returns the next tensor from rank src.
    The step's loss is the mean over the micro-batches of loss_fn(output_i, targets[i]). Returns nothing.
    """
    raise NotImplementedError   # your code here
