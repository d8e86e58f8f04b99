"""test_maize: lab 1 (maize) with DDP on 1 and 2 ranks and with Horovod on 2; rank 0 prints JSON and each run's
segmentation and autoencoder losses."""
import json
from ddlcourse.cases import maize
from ddlcourse import dist
out = {}
for name, over in [("ddp1", dict(backend="ddp", ranks=1)), ("ddp2", dict(backend="ddp", ranks=2)),
                   ("hvd2", dict(backend="horovod"))]:
    r = maize.train(maize.Config.make("smoke", fresh=True, run_name="t-" + name, eval=False, seg_epochs=1,
                                      ae_epochs=1, **over))
    if r is not None: out[name] = [r["loss"], r["ae_loss"]]
if dist.rank() == 0: print("JSON" + json.dumps(out))
