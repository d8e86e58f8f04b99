"""The DDP communication hook that sends CPU buckets through MPI: same training as DDP's default hook and as
serial, on the world and on a subgroup; which path ran is visible; switched off by $DDLCOURSE_DDP_HOOK."""
import pytest

pytestmark = pytest.mark.mpi

CODE = r"""
import os, torch
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.data.toy import teacher_classification
from ddlcourse.models.small import MLP
from ddlcourse.parallel import mpi_hook
from ddlcourse.parallel.data_parallel import wrap, unwrap

info = dist.init(horovod=False)
X, y = teacher_classification(96, dim=8, n_classes=3, seed=1)

def run(world, group, hook):
    os.environ[mpi_hook.MODE_VAR] = hook
    r = 0 if world == 1 else torch.distributed.get_rank(group)
    torch.manual_seed(0)
    model = MLP(8, 3, hidden=64, depth=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    if world > 1:
        model, opt = wrap(model, opt, "ddp", group=group, bucket_cap_mb=0.01)   # several buckets
    for step in range(4):
        idx = torch.arange(step * 24, step * 24 + 24)[r::world]
        loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
        opt.zero_grad(); loss.backward(); opt.step()
    st = mpi_hook.hook_state(model)
    return torch.cat([p.detach().flatten() for p in unwrap(model).parameters()]), st

out = {}
serial, _ = run(1, None, "mpi")
for k in sorted({2, info.world_size}):
    comm, group = dist.subgroup(k)
    g = None if k == info.world_size else group
    if comm is not None:
        p_mpi, st = run(k, g, "mpi")
        p_def, st_def = run(k, g, "default")
        out[k] = dict(mpi=(p_mpi - serial).abs().max().item(), default=(p_def - serial).abs().max().item(),
                      same=(p_mpi - p_def).abs().max().item(), mpi_buckets=st.buckets["mpi"],
                      fallback=st.buckets["default"], default_registered=st_def is not None)
    dist.barrier()
allr = MPI.COMM_WORLD.gather(out, root=0)
freed = mpi_hook.free_comms()
dist.shutdown()
if MPI.COMM_WORLD.rank == 0:
    print(repr(allr))
"""


@pytest.mark.parametrize("n", [2, 4])
def test_mpi_hook_matches_default_hook_and_serial(mpi, n):
    allr = eval(mpi(n, CODE).stdout.strip().splitlines()[-1])
    seen = set()
    for per_rank in allr:
        for k, d in per_rank.items():
            seen.add(k)
            assert d["mpi"] < 1e-5 and d["default"] < 1e-5, d
            assert d["same"] < 1e-6, d
            assert d["mpi_buckets"] >= 4 * 2 and d["fallback"] == 0, d      # several buckets per step, all MPI
            assert d["default_registered"] is False
    assert seen == ({2, n} if n > 2 else {2})


def test_mode_validates(monkeypatch):
    from ddlcourse.parallel import mpi_hook
    monkeypatch.setenv(mpi_hook.MODE_VAR, "nccl")
    with pytest.raises(ValueError, match="DDLCOURSE_DDP_HOOK"):
        mpi_hook.mode()
    monkeypatch.setenv(mpi_hook.MODE_VAR, "Default")
    assert mpi_hook.mode() == "default"
    monkeypatch.delenv(mpi_hook.MODE_VAR)
    assert mpi_hook.mode() == "mpi"          # on by default (bench_ddp's figures in mpi_hook.mode)


def test_no_mpi_path_without_torch_distributed():
    import subprocess, sys                             # a fresh process: another test may have made a group here
    code = ("from ddlcourse.parallel import mpi_hook\n"
            "assert mpi_hook.mpi_usable() is not None\n"
            "assert mpi_hook.comm_for(None) is None\n"
            "print('ok')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "ok", p.stderr[-2000:]
