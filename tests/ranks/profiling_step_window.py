"""test_profiling: profile_step on 2 ranks with the barrier done as NCCL does it, an allreduce of one number whose
gloo:all_reduce event the profiler records; rank 0 prints the collective calls of each profiled step, the
gloo:all_reduce events of its Chrome trace (the barriers' and DDP's) and the barriers called."""
import json
import os

import torch
import torch.distributed as tdist

from ddlcourse import dist, profiling as P

info = dist.init()
barriers = []


def barrier_as_nccl(group=None):
    """NCCL's barrier: an allreduce of one number on every rank (its kernel waits for the last rank to arrive)."""
    barriers.append(group)
    tdist.all_reduce(torch.zeros(1), group=group)


tdist.barrier = barrier_as_nccl
res = P.profile_step(dim=16, hidden=64, depth=2, batch=16, steps=3, trace_dir=os.environ["TRACE_DIR"])
if info.rank == 0:
    trace = json.loads(open(res["trace"]).read())["traceEvents"]
    print("calls per step", [P.collective_calls(s) for s in res["steps"]])
    print("allreduce events in the trace", sum(e.get("name") == "gloo:all_reduce" for e in trace))
    print("barriers", len(barriers))
dist.shutdown()
