"""test_model_parallel: dist.on_first_ranks when every rank of the subgroup fails, when one does, and when the
function fails on the MPI path; rank 0 prints RESULT and what each rank raised, as JSON."""
import json
from ddlcourse import dist
def bad_input(batch, group=None):              # every rank of the subgroup rejects the input
    raise ValueError(f"batch must be positive, got {batch}")
def rank0_only(group=None):                    # one rank fails, its peer would go on to a collective
    if dist.rank() == 0:
        raise KeyError("rank 0's own mistake")
    return "fine"
out = {}
for name, call in [("mp", lambda: dist.on_first_ranks(2, bad_input, -1)),
                   ("one", lambda: dist.on_first_ranks(2, rank0_only)),
                   ("rt", lambda: dist.on_first_ranks(2, lambda comm=None: 1 / 0))]:
    try:
        call()
        out[name] = "returned"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"
res = dist._comm().gather(out)
if dist.rank() == 0:
    print("RESULT" + json.dumps(res))
dist.shutdown()
