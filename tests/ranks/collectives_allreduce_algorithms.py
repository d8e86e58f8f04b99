"""test_collectives: every from-scratch allreduce against the serial sum (sizes below and above the ranks, uneven
chunks, int and float, NumPy and torch buffers) and MPI's; rank 0 prints the worst difference."""
import numpy as np
import torch
from mpi4py import MPI
from ddlcourse import collectives as col
comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
worst = 0.0
for algo in ("ring", "recursive_doubling", "reduce_bcast"):
    for nelem in (0, 1, n - 1, n, 7, 1000, 4097):        # fewer elements than ranks, uneven chunks
        for dtype in (np.float64, np.int64):
            x = (np.arange(nelem) * (r + 1) + r).astype(dtype)
            ref = np.zeros(nelem, dtype)
            for k in range(n):                             # the known answer, computed serially
                ref += (np.arange(nelem) * (k + 1) + k).astype(dtype)
            got = col.ALGORITHMS[algo](x.copy(), comm)
            worst = max(worst, float(np.abs(got - ref).max()) if nelem else 0.0)
    worst = max(worst, col.check_against_mpi(algo, 999, comm=comm))
    y = np.ones((3, 5)) * r                                # a 2-D buffer keeps its shape
    got = col.ALGORITHMS[algo](y, comm)
    assert got.shape == (3, 5)
    worst = max(worst, float(np.abs(got - n * (n - 1) / 2).max()))
    # torch tensors too, reduced in place: a contiguous one (through a NumPy view) and a strided view (a copy);
    # a CUDA tensor takes the copy path as well (mpi4py needs host memory)
    tc = torch.full((5,), float(r), requires_grad=True)
    assert col.ALGORITHMS[algo](tc, comm) is tc
    worst = max(worst, float((tc.detach() - n * (n - 1) / 2).abs().max()))
    base = torch.arange(12.0).reshape(4, 3) * (r + 1)
    view = base.t()                                        # (3, 4), not contiguous
    col.ALGORITHMS[algo](view, comm)
    worst = max(worst, float((base - torch.arange(12.0).reshape(4, 3) * n * (n + 1) / 2).abs().max()))
ring = col.ring_pass(comm)
assert ring["value"] == (r - 1) % n
tour = col.collectives_tour(comm)
assert tour["allreduce"] == [n * (n + 1) / 2] * 2 and tour["bcast"] == [1.0, 1.0]
assert tour["allgather"] == [k + 1.0 for k in range(n)]
t = col.time_allreduce("ring", 4096, reps=2, comm=comm)
f = col.fusion_demo(4, 16, reps=1, comm=comm)
worst = comm.allreduce(worst, op=MPI.MAX)
if r == 0:
    print(worst)
