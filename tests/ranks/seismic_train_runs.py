"""test_seismic: lab 2 (seismic) trained on 1 and 2 ranks, spatially split, with each backend, the 2-D model, a
resumed run and a corrupt checkpoint; rank 0 prints RESULT and each run's history, score, activation memory
(measured and predicted) and how many DDP wrappers it made, as JSON."""
import json, torch
from mpi4py import MPI
from ddlcourse.cases import seismic
from ddlcourse import training
small = dict(volume=[32, 16, 16], cube=[16, 8, 8], spatial_cube=[16, 8, 8], n_volumes=4, cubes_per_volume=2,
             n_test=2, global_batch=4, width=2, levels=2, epochs=2, lr=1e-2, memory_budget_mb=0, fresh=True)
out, ddp_made = {}, []
_ddp_init = torch.nn.parallel.DistributedDataParallel.__init__
def counting_init(self, *a, **k):                # which runs really go through DDP
    ddp_made.append(1)
    _ddp_init(self, *a, **k)
torch.nn.parallel.DistributedDataParallel.__init__ = counting_init
def run(name, **kw):
    before = len(ddp_made)
    r = seismic.train(seismic.Config.make("smoke", **{**small, **kw, "run_name": name}))
    if MPI.COMM_WORLD.rank == 0:
        out[name] = (r["history"], r["scores"]["pixel_acc"], r["activation_mb"], r["predicted_activation_mb"],
                     len(ddp_made) - before)
run("one", ranks=1)
run("two", ranks=2)
run("spatial", ranks=2, spatial=2)
run("two_allreduce", ranks=2, backend="allreduce")
run("spatial_allreduce", ranks=2, spatial=2, backend="allreduce")
run("two_horovod", ranks=2, backend="horovod")
run("one2d", ranks=1, model="2d")
run("two2d", ranks=2, model="2d")
run("half", ranks=1, epochs=1)
run("half", ranks=1, epochs=2, fresh=False)                  # the second epoch from the checkpoint
# a corrupt checkpoint: a clear error, exit code 2
if MPI.COMM_WORLD.rank == 0:
    d = training.results_dir("seismic") / "ckpt" / "bad" / "3d"
    d.mkdir(parents=True, exist_ok=True)
    (d / "epoch-0001.pt").write_bytes(b"not a checkpoint")
MPI.COMM_WORLD.Barrier()
import warnings; warnings.simplefilter("ignore")
rc = training.case_cli(seismic, ["run_name=bad", "epochs=2", "memory_budget_mb=0"], scale="smoke")
if MPI.COMM_WORLD.rank == 0:
    out["rc_bad_ckpt"] = rc
    print("RESULT" + json.dumps(out))
