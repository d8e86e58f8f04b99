"""test_synthetic_bench: synthetic_bench.run on a one-rank subgroup and on both ranks, summarised; rank 0 prints
ok."""
from mpi4py import MPI
from ddlcourse import dist, synthetic_bench as sb
dist.init()
one = sb.run(model="mlp", batch_size=4, image_size=8, width=2, num_iters=1, batches_per_iter=1, n_ranks=1)
two = sb.run(model="resnet", batch_size=2, image_size=8, width=2, num_iters=1, batches_per_iter=1)
res = MPI.COMM_WORLD.gather((one, two), root=0)
dist.shutdown()
if dist.rank() == 0:
    assert res[1][0] is None and res[0][0]["world_size"] == 1
    s = sb.summarize([r[1] for r in res])
    assert s["world_size"] == 2 and s["img_sec_total"] > 0
    print("ok")
