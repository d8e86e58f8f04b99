"""Notebook 18's coding exercises beyond what tests/test_build_it.py runs (the registered solutions and
mistakes): a ZeRO-1 step that keeps every gradient, ZeRO-3 layers that keep the full weight in ways the
registered mistakes do not, and the halo exchange plugged into the spatial layers (lab 2 trains with it)."""

ZERO1 = """
from ddlcourse.exercises import nb18_tensor_spatial as ex
reject("zero1_step", ex._zero1_variant("no_drop"), "optimizer state")
"""


def test_zero1_step_names_a_kept_gradient(on_ranks):
    on_ranks(2, ZERO1)


SHARDED = """
import torch
import torch.distributed as tdist
from ddlcourse.exercises import nb18_tensor_spatial as ex

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


PLUGGED = """
import torch
from ddlcourse import dist
from ddlcourse.exercises.nb18_tensor_spatial import halo_exchange as learners
from ddlcourse.parallel import spatial
dist.init(horovod=False)
r, n = dist.rank(), dist.world_size()
g = torch.Generator().manual_seed(5)
for shape, dim, halo in [((2, 3, 4 * n, 5, 4), 2, 1), ((2, 3, 5, 4 * n), 3, 2)]:
    x = torch.randn(shape, generator=g, dtype=torch.float64).chunk(n, dim)[r].contiguous()
    w = torch.randn([s + 2 * halo if i == dim else s for i, s in enumerate(x.shape)], generator=g, dtype=torch.float64)
    outs = []
    for exchange in (None, learners):
        xi = x.clone().requires_grad_(True)
        y = spatial.halo_exchange(xi, halo, dim, exchange=exchange)
        (y * w).sum().backward()
        outs.append((y.detach(), xi.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.allclose(outs[0][1], outs[1][1]), (r, shape)
conv = torch.nn.Conv3d(2, 3, 3, padding=1).double()
x = torch.randn(1, 2, 4 * n, 4, 4, generator=g, dtype=torch.float64).chunk(n, 2)[r].contiguous()
ys = [spatial.SpatialConv3d(conv, dim=2, exchange=e)(x) for e in (None, learners)]
assert torch.allclose(*ys)
"""


def test_a_learners_halo_exchange_plugs_into_the_spatial_layers(on_ranks):
    on_ranks(3, PLUGGED)
