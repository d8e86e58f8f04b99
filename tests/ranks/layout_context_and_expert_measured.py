"""test_layout: one transformer block under context parallelism (1 and 3 sequences per micro-batch) and the
all-to-all traffic of expert parallelism, measured; rank 0 prints RESULT and every rank's figures, as JSON."""
import json
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.models import transformer as T
from ddlcourse.experiments import context as context_exp, expert as expert_exp
dist.init()
cfg = T.TransformerConfig(vocab=11, seq_len=128, dim=64, n_heads=8, n_layers=1)
cp = context_exp.measure_block(cfg, batch=1)
cp3 = context_exp.measure_block(cfg, batch=3)                          # more than one sequence per micro-batch
ep = expert_exp.measure_traffic(tokens_per_rank=512, experts_per_rank=2, top_k=2, capacity_factor=2.0, skew=0.0)
res = MPI.COMM_WORLD.gather(dict(cp=cp, cp3=cp3, ep=ep), root=0)
if dist.rank() == 0:
    print("RESULT" + json.dumps(res))
dist.shutdown()
