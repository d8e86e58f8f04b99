"""test_spatial: SpatialConv2d/3d with halo exchange against the serial layers, forward and backward, over
kernels, dilations and split dimensions; rank 0 prints WORST and the largest difference."""
from ddlcourse import dist
from ddlcourse.experiments import spatial as spatial_exp
from mpi4py import MPI
dist.init()
res = []
for ndim, dim, k, dil, size in [(2, 2, 3, 1, 16), (2, 3, 5, 1, 16), (2, 2, 3, 2, 16), (3, 2, 3, 1, 8), (3, 4, 3, 1, 8)]:
    res.append(spatial_exp.compare_with_serial(ndim=ndim, size=size, kernel=k, dim=dim, dilation=dil))
worst = max(max(r.values()) for r in res)
worst = MPI.COMM_WORLD.allreduce(worst, op=MPI.MAX)
if dist.rank() == 0:
    print("WORST", worst)
dist.shutdown()
