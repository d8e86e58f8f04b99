"""test_exercises_sharded_data_parallel: ZeRO-3 layers that keep the full weight on the layer, or let autograd save
it, are named."""
from tests.ranks._on_ranks import finish, reject

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

finish()
