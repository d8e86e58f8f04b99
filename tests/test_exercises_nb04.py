"""The coding exercise of notebook 04 (collectives): the reduce-scatter loop of the ring, on real ranks."""
import pytest

CODE = """
from ddlcourse import collectives
from ddlcourse.exercises import nb04_collectives as ex
from ddlcourse.selfcheck import run_checker
from mpi4py import MPI
r = MPI.COMM_WORLD.Get_rank()
v = run_checker("ring_reduce_scatter", collectives.ring_reduce_scatter)
assert v.ok, v.message
def mine(chunks, comm):                       # written from the contract, not the package's
    r, n = comm.Get_rank(), comm.Get_size()
    for s in range(n - 1):
        got = comm.sendrecv(chunks[(r - s) % n].copy(), dest=(r + 1) % n, source=(r - 1) % n)
        chunks[(r - s - 1) % n] += got
assert run_checker("ring_reduce_scatter", mine).ok
for wrong, hint in [(ex._rs_variant(-1, -2), "off by one"), (ex._rs_variant(0, -1, overwrite=True), "overwrote"),
                    (ex._rs_variant(0, -1, steps_extra=1), "one step too many")]:
    v = run_checker("ring_reduce_scatter", wrong)
    assert not v.ok and hint in v.message, (r, v.message)
oks = MPI.COMM_WORLD.gather(r)
if r == 0:
    print("checked on ranks", sorted(oks))
"""


@pytest.mark.parametrize("n", [2, 3])
def test_ring_reduce_scatter_checker_on_ranks(mpi, n):
    out = mpi(n, CODE).stdout
    assert f"checked on ranks {list(range(n))}" in out, out
