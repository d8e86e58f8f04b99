"""The coding exercises of the tensor/sequence-parallel notebook beyond what tests/test_build_it.py runs (the
registered solutions and mistakes): the package's own reduce-scatter passes, and so does a tensor-parallel MLP
whose shards are float32, as a learner's `nn.Linear(dim, k)` without a dtype would be."""

CODE = """
import torch
from ddlcourse.exercises import nb12b_tensor_sequence_parallel as ex
from ddlcourse.parallel import sequence
v = run_checker("sp_reduce_scatter", sequence.reduce_scatter_seq)
assert v.ok, v.message

class Float32(ex.TPMLP):
    def __init__(self, fc1, fc2, rank, world):
        super().__init__(fc1.float(), fc2.float(), rank, world)
    def forward(self, x):
        return super().forward(x.float())
v = run_checker("tp_mlp", Float32)
assert v.ok, v.message
"""


def test_package_reduce_scatter_and_a_float32_mlp_pass(on_ranks):
    on_ranks(2, CODE)
