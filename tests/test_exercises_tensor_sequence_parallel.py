"""Checker of the coding exercise of the tensor/sequence-parallel notebook, on real ranks: accepts the
reference, names the typical mistakes."""
import json

import pytest

CODE = """
import json
import torch
import torch.distributed as tdist
from mpi4py import MPI
from ddlcourse import dist, selfcheck
from ddlcourse.exercises import nb12b_tensor_sequence_parallel as ex
from ddlcourse.parallel import sequence
dist.init(horovod=False)

def correct(x, group):                          # written here: sum of the partials, then my slice of the sequence
    t, r = tdist.get_world_size(group), tdist.get_rank(group)
    chunks = [c.contiguous() for c in x.chunk(t, 1)]
    out = torch.empty_like(chunks[0])
    tdist.reduce_scatter(out, chunks, group=group)
    return out

def all_reduce_only(x, group):
    x = x.clone(); tdist.all_reduce(x, group=group); return x

def unwritten(x, group):
    raise NotImplementedError

fns = dict(package=sequence.reduce_scatter_seq, correct=correct, no_sum=ex._no_sum, wrong_dim=ex._wrong_dim,
           mean=ex._mean, wrong_chunk=ex._wrong_chunk, all_reduce=all_reduce_only, unwritten=unwritten)
out = {k: [v.ok, v.message] for k, v in ((k, selfcheck.run_checker("sp_reduce_scatter", f)) for k, f in fns.items())}
res = MPI.COMM_WORLD.gather(out, root=0)
if dist.rank() == 0:
    print("RESULT" + json.dumps(res))
dist.shutdown()
"""


@pytest.mark.parametrize("n", [2])
def test_sp_reduce_scatter_checker(mpi, n):
    res = json.loads(mpi(n, CODE).stdout.split("RESULT")[1])
    for out in res:
        assert out["package"][0] and out["correct"][0]
        expect = dict(no_sum="without summing", wrong_dim="dim 0", mean="averaged", wrong_chunk="another rank",
                      all_reduce="whole sum", unwritten="not written yet")
        for k, text in expect.items():
            assert not out[k][0] and text in out[k][1], (k, out[k])
