"""test_exercises_data_parallel: lab 1 (maize) trained on one rank with DDP and on every rank with the reference
MyDDP; rank 0 prints JSON and both runs' segmentation and autoencoder losses."""
import json
from ddlcourse.cases import maize
from ddlcourse.exercises.solutions.data_parallel import MyDDP
from ddlcourse import dist
out = {}
for name, over, ddp in [("one", dict(backend="ddp", ranks=1), None), ("mine", dict(backend="ddp"), MyDDP)]:
    r = maize.train(maize.Config.make("smoke", fresh=True, run_name="t-" + name, eval=False, seg_epochs=1,
                                      ae_epochs=1, **over), ddp=ddp)
    if r is not None: out[name] = [r["loss"], r["ae_loss"]]
if dist.rank() == 0: print("JSON" + json.dumps(out))
