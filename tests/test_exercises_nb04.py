"""The coding exercise of notebook 04 (collectives): the reduce-scatter loop of the ring, on real ranks."""
import pytest

CODE = """
from ddlcourse import collectives
from ddlcourse.exercises import nb04_collectives as ex
v = run_checker("ring_reduce_scatter", collectives.ring_reduce_scatter)
assert v.ok, v.message
def mine(chunks, comm):                       # written from the contract, not the package's
    r, n = comm.Get_rank(), comm.Get_size()
    for s in range(n - 1):
        got = comm.sendrecv(chunks[(r - s) % n].copy(), dest=(r + 1) % n, source=(r - 1) % n)
        chunks[(r - s - 1) % n] += got
assert run_checker("ring_reduce_scatter", mine).ok
reject("ring_reduce_scatter", ex._rs_variant(-1, -2), "off by one")
reject("ring_reduce_scatter", ex._rs_variant(0, -1, overwrite=True), "overwrote")
reject("ring_reduce_scatter", ex._rs_variant(0, -1, steps_extra=1), "one step too many")
"""


@pytest.mark.parametrize("n", [2, 3])
def test_ring_reduce_scatter_checker_on_ranks(on_ranks, n):
    on_ranks(n, CODE)
