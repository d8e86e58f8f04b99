"""test_exercises_sharded_data_parallel: a ZeRO-1 step that keeps every gradient is named."""
from tests.ranks._on_ranks import finish, reject

from ddlcourse.exercises.solutions import sharded_data_parallel as ex
reject("zero1_step", ex._zero1_variant("no_drop"), "optimizer state")

finish()
