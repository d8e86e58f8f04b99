"""test_driving: the driving case on 4 ranks in every layout (data parallel on 2 of 4 and on 4, model parallel,
a 2x2 mesh, Horovod) and resumed runs (whole model, and split over 2 ranks); rank 0 prints the histories, the
clips each rank held and the class counts, as JSON."""
import json
from ddlcourse import dist
from ddlcourse.cases import driving
out = {}
for name, kw in {"serial": dict(ranks=1), "dp2of4": dict(ranks=2), "dp4": dict(), "mp4": dict(mp=4, micro_batches=2),
                 "mesh2x2": dict(mp=2, micro_batches=2), "horovod": dict(backend="horovod")}.items():
    cfg = driving.Config.make("smoke", fresh=True, run_name="t-" + name, epochs=1, **kw)
    r = driving.train(cfg)
    if dist.rank() == 0:
        out[name] = r["history"]
        out[name + "_clips"] = r["train_clips"]
        out[name + "_counts"] = r["class_counts"]
# resume: 2 epochs in one go == 1 epoch, then resume for the 2nd
a = driving.train(driving.Config.make("smoke", fresh=True, run_name="t-full", epochs=2))
driving.train(driving.Config.make("smoke", fresh=True, run_name="t-half", epochs=1))
b = driving.train(driving.Config.make("smoke", fresh=False, run_name="t-half", epochs=2))
# the same with the model split over 2 ranks per replica: every part is saved and restored
mesh = dict(mp=2, micro_batches=2)
c = driving.train(driving.Config.make("smoke", fresh=True, run_name="t-mfull", epochs=2, **mesh))
driving.train(driving.Config.make("smoke", fresh=True, run_name="t-mhalf", epochs=1, **mesh))
d = driving.train(driving.Config.make("smoke", fresh=False, run_name="t-mhalf", epochs=2, **mesh))
if dist.rank() == 0:
    out["full"], out["resumed"] = a["history"], b["history"]
    out["mfull"], out["mresumed"] = c["history"], d["history"]
    print(json.dumps(out))
