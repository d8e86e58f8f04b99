"""test_sharded: DDP, ZeRO-1, ZeRO-2 and FSDP2 against serial training, with each one's memory per rank; rank 0
prints a MODE line per mode, and every rank the FSDP objects still alive after dist.shutdown."""
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.experiments import sharded as sharded_exp
dist.init()
out = {}
for mode in ("ddp", "zero1", "zero2", "fsdp"):
    d = sharded_exp.compare_with_serial(mode, steps=3, global_batch=16, dim=16, hidden=32, depth=2)
    worst = MPI.COMM_WORLD.allreduce(max(d["param_diff"], d["loss_diff"]), op=MPI.MAX)
    mem = MPI.COMM_WORLD.allreduce(d["memory"]["total"], op=MPI.SUM) / dist.world_size()
    out[mode] = (worst, mem)
if dist.rank() == 0:
    for m, (w, mem) in out.items():
        print("MODE", m, w, mem)
dist.shutdown()
import gc
alive = sorted({type(o).__name__ for o in gc.get_objects() if type(o).__name__.startswith("FSDP")})
print("ALIVE AFTER SHUTDOWN", MPI.COMM_WORLD.Get_rank(), alive)
