"""The build-it exercise of notebook 10 (one FedAvg round on the ranks). tests/test_build_it.py checks the
reference and the registered mistakes; here: a correct round written another way is accepted too, and a
wrong one that is no known mistake is described."""
from helpers import check_on_ranks


def test_fedavg_round_accepts_another_correct_round():
    check_on_ranks(3, "exercises_federated_fedavg_round")
