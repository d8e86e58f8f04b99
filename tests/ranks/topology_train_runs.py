"""test_topology: lab 3 (topology) trained once for each (name, epochs, resume, backend) of ``sys.argv[1]`` (JSON),
one torch start for all; rank 0 prints RESULT and each run's history, metrics and steps, as JSON."""
import json
import sys

from ddlcourse.cases import topology as case
from ddlcourse import dist
out = {}
for name, epochs, resume, backend in json.loads(sys.argv[1]):
    cfg = case.Config.make("smoke", ny=8, nx=16, n_train=16, n_val=4, chunk_size=2, maxloop=6, width=4, depth=2,
                           global_batch=8, epochs=epochs, run_name=name, fresh=not resume, backend=backend)
    res = case.train(cfg)
    out[f"{name}{epochs}"] = dict(history=res["history"], metrics=res["metrics"], steps=res["steps"])
if dist.rank() == 0:
    print("RESULT" + json.dumps(out))
dist.shutdown()
