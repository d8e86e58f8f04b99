"""Pipeline schedules (GPipe, 1F1B) against the serial model; schedule shapes; torch.distributed.pipelining."""
import pytest

from ddlcourse.parallel.pipeline import predicted_bubble, schedule_order

CODE = """
import torch
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.parallel import pipeline
from ddlcourse.experiments import pipeline as pipeline_exp
dist.init()
worst, infl = 0.0, {}
for sched in ("gpipe", "1f1b"):
    for m in (1, 3, 4):
        r = pipeline_exp.compare_with_serial(num_micro_batches=m, micro_batch=4, n_layers=6, schedule=sched)
        worst = max(worst, r["loss_diff"], r["grad_diff"])
        infl[(sched, m)] = r["max_in_flight"]
worst = MPI.COMM_WORLD.allreduce(worst, op=MPI.MAX)
infl = MPI.COMM_WORLD.gather(infl, root=0)
if dist.rank() == 0:
    print("WORST", worst)
    print("INFL", infl[0][("gpipe", 4)], infl[0][("1f1b", 4)])
dist.shutdown()
"""


@pytest.mark.parametrize("n", [2, 3])
def test_pipeline_matches_serial(mpi, n):
    p = mpi(n, CODE)
    out = p.stdout
    assert float(out.split("WORST")[1].split()[0]) < 1e-5, out
    g, f = map(int, out.split("INFL")[1].split()[:2])
    assert g == 4 and f == min(n, 4), out          # 1F1B holds at most num_stages micro-batches on stage 0


def test_schedule_order():
    for sched in ("gpipe", "1f1b"):
        for s in range(4):
            order = schedule_order(sched, s, 4, 6)
            assert sorted(order) == sorted([("F", i) for i in range(6)] + [("B", i) for i in range(6)])
            for i in range(6):
                assert order.index(("F", i)) < order.index(("B", i))
    assert schedule_order("1f1b", 3, 4, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert predicted_bubble(4, 4) == pytest.approx(3 / 7)
    with pytest.raises(ValueError):
        schedule_order("zigzag", 0, 2, 2)


TORCH_CODE = """
import torch
from torch import nn
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.parallel import pipeline, model_parallel as mp
from ddlcourse.experiments import pipeline as pipeline_exp, model_parallel as mp_exp
from ddlcourse.data.toy import teacher_classification
dist.init()
s, p = dist.rank(), dist.world_size()
X, Y = teacher_classification(16, dim=16, n_classes=4, seed=0)
loss_fn = nn.CrossEntropyLoss()
a = mp.stage_module(mp_exp.demo_model(0, n_layers=4), s, p)
b = mp.stage_module(mp_exp.demo_model(0, n_layers=4), s, p)
pipeline.run(a, list(X.chunk(4)), list(Y.chunk(4)), loss_fn, "gpipe")
pipeline.torch_pipelining_step(b, X, Y, loss_fn, 4, "gpipe")
d = max((u.grad - v.grad).abs().max().item() for u, v in zip(a.parameters(), b.parameters()))
d = MPI.COMM_WORLD.allreduce(d, op=MPI.MAX)
if s == 0:
    print("DIFF", d)
dist.shutdown()
"""


def test_same_as_torch_pipelining(mpi):
    p = mpi(2, TORCH_CODE)
    assert float(p.stdout.split("DIFF")[1].split()[0]) < 1e-5, p.stdout + p.stderr[-2000:]


WORK_CODE = """
from ddlcourse import dist
from ddlcourse.parallel import pipeline, model_parallel as mp
from ddlcourse.experiments import pipeline as pipeline_exp, model_parallel as mp_exp
from ddlcourse.data.toy import teacher_classification
from torch import nn
dist.init()
slept = []
pipeline._emulate = slept.append          # record the emulated work instead of sleeping
s, p = dist.rank(), dist.world_size()
X, Y = teacher_classification(24, dim=16, n_classes=4, seed=0)
said = []
for m in (1, 4, 6):
    slept.clear()
    stage = mp.stage_module(mp_exp.demo_model(0, n_layers=4), s, p)
    pipeline.run(stage, list(X.chunk(m)), list(Y.chunk(m)), nn.CrossEntropyLoss(), "1f1b",
                 delay_s=0.3, overhead_s=0.01)
    said.append(f"RANK {s} M {m} TOTAL {sum(slept):.6f} N {len(slept)}")
from mpi4py import MPI   # one print on rank 0: the ranks' own prints would interleave
everything = MPI.COMM_WORLD.gather(said, root=0)
if s == 0:
    print("\\n".join(line for lines in everything for line in lines))
dist.shutdown()
"""


def test_emulated_work_scales_with_micro_batch(mpi):
    # Same global batch: the emulated work of the batch (3 * delay_s per stage) is the same for every m;
    # only the fixed per-micro-batch overhead (2 * m * overhead_s) grows with m.
    out = mpi(2, WORK_CODE).stdout
    rows = [line.split() for line in out.splitlines() if line.startswith("RANK")]
    assert len(rows) == 6, out
    for _, _, _, m, _, total, _, n in rows:
        assert int(n) == 2 * int(m)
        assert float(total) == pytest.approx(3 * 0.3 + 2 * int(m) * 0.01, rel=1e-9), out
    assert pipeline_predicted(2, 4) == pytest.approx((4 + 1) * (3 * 0.3 / 4 + 2 * 0.01))


def pipeline_predicted(p, m):
    from ddlcourse.parallel.pipeline import predicted_step_time
    return predicted_step_time(p, m, 0.3, 0.01)
