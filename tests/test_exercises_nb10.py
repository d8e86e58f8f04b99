"""The coding exercise of notebook 10 (model parallelism): send/recv of activations and gradients, on real ranks."""

CODE = """
from ddlcourse import dist
from ddlcourse.exercises import nb10_model_parallel as ex
from ddlcourse.selfcheck import run_checker
def mine(stage, x, y, loss_fn, rank, world, send, recv):     # written here, as a learner would
    inp = x if rank == 0 else recv(rank - 1).requires_grad_(True)
    out = stage(inp)
    if rank < world - 1:
        send(out, rank + 1)
        out.backward(recv(rank + 1))
    else:
        loss_fn(out, y).backward()
    if rank > 0:
        send(inp.grad, rank - 1)
v = run_checker("stage_send_recv", mine)
assert v.ok, v.message
from mpi4py import MPI
# A mistake may leave some ranks right (the last stage's "ones" variant is correct there); the exercise is
# right only if every rank is, so each mistake must be caught, and named, on at least one rank.
for kind, hint in [("ones", "backward from ones"), ("summed", "times the number of stages")]:
    v = run_checker("stage_send_recv", ex._step_variant(kind))
    vs = MPI.COMM_WORLD.allgather((v.ok, v.message))
    assert not all(ok for ok, _ in vs) and all(ok or hint in msg for ok, msg in vs), (kind, vs)
oks = MPI.COMM_WORLD.gather(dist.rank())
if dist.rank() == 0:
    print("checked on ranks", sorted(oks))
dist.shutdown()
"""


def test_stage_send_recv_checker_on_ranks(mpi):
    out = mpi(3, CODE).stdout
    assert "checked on ranks [0, 1, 2]" in out, out
