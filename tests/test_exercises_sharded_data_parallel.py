"""Notebook 19's coding exercises beyond what tests/test_build_it.py runs (the registered solutions and
mistakes): a ZeRO-1 step that keeps every gradient, and ZeRO-3 layers that keep the full weight in ways the
registered mistakes do not."""

ZERO1 = """
from ddlcourse.exercises.solutions import sharded_data_parallel as ex
reject("zero1_step", ex._zero1_variant("no_drop"), "optimizer state")
"""


def test_zero1_step_names_a_kept_gradient(on_ranks):
    on_ranks(2, ZERO1)


SHARDED = """
import torch
import torch.distributed as tdist
from ddlcourse.exercises.solutions import sharded_data_parallel as ex

class Cached(ex.ShardedLinear):                        # keeps the gathered weight on the layer
    def gather(self, shard):
        w, b = super().gather(shard)
        self.full_weight = w
        return w, b

class _Gather(torch.autograd.Function):                # a differentiable all-gather of the flat parameters
    @staticmethod
    def forward(ctx, shard, world):
        parts = [torch.empty_like(shard) for _ in range(world)]
        tdist.all_gather(parts, shard.contiguous())
        ctx.world = world
        return torch.cat(parts)
    @staticmethod
    def backward(ctx, g):
        out = torch.empty(g.numel() // ctx.world, dtype=g.dtype)
        tdist.reduce_scatter(out, list(g.chunk(ctx.world)))
        return out / ctx.world, None

class PlainAutograd(ex.ShardedLinear):                 # autograd saves the gathered weight for backward
    def forward(self, x):
        full = _Gather.apply(self.shard, self.world)
        n_w = self.out_features * self.in_features
        w = full[:n_w].view(self.out_features, self.in_features)
        return torch.nn.functional.linear(x, w, full[n_w:self.numel])

for cls, what in [(Cached, "the layer keeps tensors"), (PlainAutograd, "autograd keeps a tensor")]:
    reject("sharded_linear", cls, "the full weight stays alive")
    reject("sharded_linear", cls, what)
"""


def test_sharded_linear_sees_a_full_weight_kept_elsewhere(on_ranks):
    on_ranks(3, SHARDED)
