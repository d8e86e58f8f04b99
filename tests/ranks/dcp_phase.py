"""test_dcp: one phase of a run with a DCP checkpoint at ``sys.argv[1]``: ``save`` (``sys.argv[2]``) trains
steps 0-4 and saves, ``load`` loads on this many ranks and trains steps 4-8; each rank prints SAVED or RESUMED
with what it holds and whether the run continues the serial one exactly."""
import sys, torch
from ddlcourse import dist, dcp
dist.init(); torch.set_num_threads(1)
ckpt, phase = sys.argv[1], sys.argv[2]
assert phase in ("save", "load"), phase
if phase == "load":
    res = dcp.train_phase(4, 8, load_from=ckpt)
    ref = dcp.train_serial(8)
    print("RESUMED", res["n_ranks"], res["local_rows"], dcp.continues_exactly(res["losses"], ref["losses"][4:]),
          float((res["params"] - ref["params"]).abs().max()) < 1e-5)
else:
    res = dcp.train_phase(0, 4, save_to=ckpt)
    ref = dcp.train_serial(4)
    print("SAVED", res["n_ranks"], res["local_rows"], dcp.continues_exactly(res["losses"], ref["losses"]),
          res["files_written"])
