"""test_sequence_parallel: tensor and sequence parallelism of a transformer block (hand-written and with
DTensor) against the serial block and model, with the config of ``sys.argv[1]``, and the activations and bytes of
each scheme with the config of ``sys.argv[2]`` (both JSON); rank 0 prints RESULT and every rank's figures, as JSON."""
import json
import sys

from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.models import transformer as T
from ddlcourse.experiments import sequence as sequence_exp
dist.init()
cmp = sequence_exp.compare_with_serial(T.TransformerConfig(**json.loads(sys.argv[1])), batch=2)
mem = sequence_exp.activation_sweep(T.TransformerConfig(**json.loads(sys.argv[2])), batch=2)
res = MPI.COMM_WORLD.gather(dict(cmp=cmp, mem=mem), root=0)
if dist.rank() == 0:
    print("RESULT" + json.dumps(res))
dist.shutdown()
