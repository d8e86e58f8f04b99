"""The coding exercise of notebook 12 (spatial parallelism): the halo exchange, on real ranks."""

CODE = """
import torch
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.exercises import nb12_tensor_spatial_sharded as ex
from ddlcourse.selfcheck import run_checker
def mine(x, halo, rank, world, send, recv):           # written here, as a learner would
    if rank > 0:
        send(x[:, :, :halo], rank - 1)
    if rank < world - 1:
        send(x[:, :, -halo:], rank + 1)
    z = torch.zeros_like(x[:, :, :halo])
    above = recv(rank - 1) if rank > 0 else z
    below = recv(rank + 1) if rank < world - 1 else z
    return torch.cat([above, x, below], dim=2)
v = run_checker("halo_exchange", mine)
assert v.ok, v.message
for kind, hint in [("wrong_edge", "wrong edge"), ("periodic", "halo is zeros")]:
    v = run_checker("halo_exchange", ex._halo_variant(kind))
    vs = MPI.COMM_WORLD.allgather((v.ok, v.message))
    assert not all(ok for ok, _ in vs) and all(ok or hint in msg for ok, msg in vs), (kind, vs)
oks = MPI.COMM_WORLD.gather(dist.rank())
if dist.rank() == 0:
    print("checked on ranks", sorted(oks))
dist.shutdown()
"""


def test_halo_exchange_checker_on_ranks(mpi):
    out = mpi(3, CODE).stdout
    assert "checked on ranks [0, 1, 2]" in out, out


ZERO1 = """
import torch
import torch.distributed as tdist
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.exercises import nb12_tensor_spatial_sharded as ex
from ddlcourse.selfcheck import run_checker
def mine(params, owner, rank, world, optimizer):      # written here, as a learner would
    for p, o in zip(params, owner):
        tdist.reduce(p.grad, dst=o)
        if o == rank:
            p.grad.div_(world)
        else:
            p.grad = None
    optimizer.step()
    for p, o in zip(params, owner):
        tdist.broadcast(p.data, src=o)
v = run_checker("zero1_step", mine)
assert v.ok, v.message
for kind, hint in [("sum", "divide it by world"), ("no_broadcast", "stale"), ("all_step", "optimizer state"),
                   ("no_drop", "optimizer state"), ("local", "reduce (sum) every gradient")]:
    v = run_checker("zero1_step", ex._zero1_variant(kind))
    vs = MPI.COMM_WORLD.allgather((v.ok, v.message))
    assert not all(ok for ok, _ in vs) and all(ok or hint in msg for ok, msg in vs), (kind, vs)
def unwritten(*a):
    raise NotImplementedError
assert "not written yet" in run_checker("zero1_step", unwritten).message
oks = MPI.COMM_WORLD.gather(dist.rank())
if dist.rank() == 0:
    print("checked on ranks", sorted(oks))
dist.shutdown()
"""


def test_zero1_step_checker_on_ranks(mpi):
    out = mpi(2, ZERO1).stdout
    assert "checked on ranks [0, 1]" in out, out
