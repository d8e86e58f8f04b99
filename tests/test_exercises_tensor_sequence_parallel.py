"""The coding exercises of the tensor/sequence-parallel notebook beyond what tests/test_build_it.py runs (the
registered solutions and mistakes): a sequence-parallel MLP built from the package's own all-gather /
reduce-scatter pair and gradient sync passes the learner's checker (the package and the exercise agree), and so
does a tensor-parallel MLP whose shards are float32, as a learner's `nn.Linear(dim, k)` without a dtype would be."""
from helpers import check_on_ranks


def test_package_sequence_parallel_mlp_and_a_float32_mlp_pass():
    check_on_ranks(2, "exercises_tensor_sequence_parallel_package_mlps")
