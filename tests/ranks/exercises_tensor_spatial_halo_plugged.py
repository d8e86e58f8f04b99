"""test_exercises_tensor_spatial: the reference halo exchange plugged into spatial.halo_exchange and
SpatialConv3d gives what the package's own exchange gives, values and gradients."""
from tests.ranks._on_ranks import finish

import torch
from ddlcourse import dist
from ddlcourse.exercises.solutions.tensor_spatial import halo_exchange as learners
from ddlcourse.parallel import spatial
dist.init()
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

finish()
