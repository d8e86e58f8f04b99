"""test_dcp: ``save`` (``sys.argv[2]``) trains 8 steps saving at step 3 to ``sys.argv[1]`` (rank 0 also keeps
what it saved, and trains the 2-D run's serial reference); ``load`` loads that checkpoint and trains steps 3-8.
Each rank prints SAVED, OTHER or RESUMED with the checks."""
import sys

import torch
from ddlcourse import dist, dcp, integrity
dist.init(); torch.set_num_threads(1)
ckpt, phase = sys.argv[1], sys.argv[2]
assert phase in ("save", "load"), phase
if phase == "load":
    res = dcp.train_phase(3, 8, load_from=ckpt)
    saved = torch.load(ckpt + "_saved.pt")
    print("RESUMED", torch.equal(res["params_loaded"], saved["params_saved"]),
          integrity.trajectories_agree(saved["losses"][3:], res["losses"], atol=1e-5, exact_steps=5))
else:
    res = dcp.train_phase(0, 8, save_to=ckpt, save_at=3)
    two_d = dcp.train_2d(6, dp=1, first_steps=2, serial=True)
    if torch.distributed.get_rank() == 0:
        torch.save(res, ckpt + "_saved.pt")
        ref = two_d["serial"]
        print("SAVED", len(res["losses"]), res["files_written"] is not None, ref["params_first"].shape == two_d["params_first"].shape,
              dcp.param_gap(two_d["params_first"], ref["params_first"]) < 1e-5, dcp.param_gap(two_d["params"], ref["params"]) < 1e-5,
              integrity.trajectories_agree(ref["losses"], two_d["losses"], atol=1e-5, exact_steps=5))
    else:
        print("OTHER", two_d["serial"] is None)
