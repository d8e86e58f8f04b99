"""test_context_parallel: ring attention and the model on every layout; rank 0 prints RESULT and every rank's
largest differences and causal scores, as JSON."""
import json
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.parallel import context
from ddlcourse.experiments import context as context_exp
dist.init()
out = {}
for layout in context.LAYOUTS:
    a = context_exp.compare_attention(seq_len=32, layout=layout)
    m = context_exp.compare_model(layout=layout)
    out[layout] = dict(attn=max(v for k, v in a.items() if k in ("out", "dq", "dk", "dv")),
                       model=max(m["loss_diff"], m["grad_diff"]), scores=a["scores"])
res = MPI.COMM_WORLD.gather(out, root=0)
if dist.rank() == 0:
    print("RESULT" + json.dumps(res))
dist.shutdown()
