"""Build it: interleaved_order, the coding exercise 'interleaved_order' of notebooks/17_pipeline_schedules.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise interleaved_order exercises/pipeline_schedules/interleaved_order.py

The checker loads the whole file, so helper functions you write here come with it.
"""


def interleaved_order(rank, num_ranks, num_micro_batches, stages_per_rank):
    """The interleaved 1F1B order of `rank`: a list of ("F", stage, micro_batch) and ("B", stage, micro_batch)."""
    raise NotImplementedError   # your code here
