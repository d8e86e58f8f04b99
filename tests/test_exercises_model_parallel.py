"""The coding exercise of notebook 15 (model parallelism): one step across the stages, on real ranks.

``tests/test_build_it.py`` runs the reference and the registered mistakes on 2 and 3 ranks; here: another
correct way to write it (a different header) passes, and two more mistakes are named on every rank."""
from helpers import check_on_ranks


def test_stage_send_recv_checker_on_ranks():
    check_on_ranks(3, "exercises_model_parallel_stage_send_recv")
