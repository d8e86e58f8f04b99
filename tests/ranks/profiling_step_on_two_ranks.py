"""test_profiling: profile_step serial, with DDP (tracing to $TRACE_DIR) and with rank 1 delayed, and
compare_compile; rank 0 prints a line per rank (comm, events, trace, wait, same) and the straggler found."""
from ddlcourse import dist, profiling as P
from ddlcourse.dist import on_first_ranks
import os, pytest
info = dist.init()
kw = dict(dim=16, hidden=64, depth=2, batch=16, steps=2, bucket_cap_mb=0.01)
serial = on_first_ranks(1, P.profile_step, ddp=False, **kw)
both = on_first_ranks(2, P.profile_step, trace_dir=os.environ["TRACE_DIR"], **kw)
slow = on_first_ranks(2, P.profile_step, delay_rank=1, delay_s=0.3, **kw)
with pytest.raises(ValueError, match="delay_rank"):
    P.profile_step(delay_rank=5, **kw)
cmp = on_first_ranks(2, P.compare_compile, dim=16, hidden=64, depth=2, batch=16, steps=2, backend="aot_eager")
lines = dist._comm().gather(
    f"rank {info.rank}: serial_comm {None if serial is None else serial['phases']['allreduce'] == 0} "
    f"ddp_comm {both['phases']['allreduce'] > 0} events {all(len(s) > 0 for s in both['steps'])} "
    f"trace {os.path.isfile(both['trace'])} wait {slow['phases']['allreduce']:.4f} "
    f"same {cmp['loss_diff'] <= 1e-5 * abs(cmp['loss']) and cmp['grad_diff'] <= 1e-5 * cmp['grad_scale']}", root=0)
waits = dist._comm().gather(slow["phases"]["allreduce"], root=0)
if info.rank == 0:
    print("\n".join(lines))
    print("straggler", P.find_straggler(waits))
dist.shutdown()
