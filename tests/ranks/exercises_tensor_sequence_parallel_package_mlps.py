"""test_exercises_tensor_sequence_parallel: a sequence-parallel MLP built from the package's all-gather /
reduce-scatter and gradient sync passes sp_mlp, and a tensor-parallel MLP with float32 shards passes tp_mlp."""
from tests.ranks._on_ranks import finish, run_checker

import torch
from ddlcourse.exercises.solutions import tensor_sequence_parallel as ex
from ddlcourse.parallel import sequence

class FromThePackage(ex.SPMLP):
    def __init__(self, ln, fc1, fc2, rank, world):
        super().__init__(ln, fc1, fc2, rank, world)
        for p in (self.ln.weight, self.ln.bias, self.fc2.bias):
            p.sequence_parallel = True
    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc1(sequence.gather_seq(self.ln(x))))
        return x + sequence.reduce_scatter_seq(torch.nn.functional.linear(h, self.fc2.weight)) + self.fc2.bias
    def sync_grads(self):
        sequence.sync_sequence_parallel_grads(self)
v = run_checker("sp_mlp", FromThePackage)
assert v.ok, v.message

class Float32(ex.TPMLP):
    def __init__(self, fc1, fc2, rank, world):
        super().__init__(fc1.float(), fc2.float(), rank, world)
    def forward(self, x):
        return super().forward(x.float())
v = run_checker("tp_mlp", Float32)
assert v.ok, v.message

finish()
