"""ddlcourse.dist and checks, on real MPI ranks (mpiexec from the venv)."""
import subprocess
import sys

import pytest

from ddlcourse import checks, dist

pytestmark = pytest.mark.mpi


def test_seed_rule_is_documented_and_distinct():
    assert dist.seed_for_rank(1234, 0) == 1234
    assert dist.seed_for_rank(1234, 3) == 4234
    assert len({dist.seed_for_rank(7, r) for r in range(64)}) == 64


def test_expected_sum():
    assert checks.expected_sum(4, 2) == [10.0, 10.0]
    res = [{"mpi4py": [3.0], "torch.distributed": [3.0], "horovod": [3.0]}] * 2
    assert checks.agree(res, 2, 1)
    res[1] = {"mpi4py": [3.0], "torch.distributed": [3.0], "horovod": [2.0]}
    assert not checks.agree(res, 2, 1)


def test_allreduce_three_ways_on_two_ranks(mpi):
    p = mpi(2, "import sys; from ddlcourse.__main__ import main; sys.exit(main(['check', '--length', '3']))")
    assert "all three agree with the expected sum [3.0, 3.0, 3.0]: True" in p.stdout


def test_init_is_idempotent_and_ranks_are_consistent(mpi):
    code = (
        "from ddlcourse import dist\n"
        "a = dist.init(); b = dist.init(); assert a is b\n"
        "import torch.distributed as t\n"
        "assert t.get_rank() == a.rank and t.get_world_size() == 3 == a.world_size\n"
        "assert a.backend == 'gloo' and str(a.device) == 'cpu' and a.local_rank == a.rank\n"
        "s = dist.seed_everything(5); import torch; x = torch.rand(1).item()\n"
        "from mpi4py import MPI; xs = MPI.COMM_WORLD.allgather(x)\n"
        "assert len(set(xs)) == 3, xs  # per-rank seeds differ\n"
        "dist.seed_everything(5, per_rank=False); y = MPI.COMM_WORLD.allgather(torch.rand(1).item())\n"
        "assert len(set(y)) == 1, y   # a shared seed agrees\n"
        "oks = MPI.COMM_WORLD.gather(f'ok{a.rank}', root=0)\n"
        "dist.shutdown()\n"
        "if a.rank == 0: print(' '.join(oks))\n"
    )
    p = mpi(3, code)
    assert p.stdout.split() == ["ok0", "ok1", "ok2"]


def test_bad_backend():
    with pytest.raises(ValueError, match="unknown backend"):
        dist.init(backend="mpi", horovod=False)


def test_cli_info_and_errors():
    out = subprocess.run([sys.executable, "-m", "ddlcourse", "info"], capture_output=True, text=True)
    assert out.returncode == 0 and "torch" in out.stdout and "MISSING" not in out.stdout
    bad = subprocess.run([sys.executable, "-m", "ddlcourse", "run", "nosuchcase"], capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown case 'nosuchcase'" in bad.stderr


def test_subgroup_runs_smaller_worlds_inside_one_cluster(mpi):
    code = (
        "from ddlcourse import dist\n"
        "import torch, torch.distributed as t\n"
        "info = dist.init(horovod=False)\n"
        "out = []\n"
        "for k in (1, 2, 3):\n"
        "    comm, g = dist.subgroup(k)\n"
        "    if comm is not None:\n"
        "        x = torch.tensor([float(info.rank + 1)]); t.all_reduce(x, group=g)\n"
        "        assert comm.Get_size() == k and comm.allreduce(info.rank + 1) == x.item() == k * (k + 1) / 2\n"
        "        out.append(k)\n"
        "from mpi4py import MPI\n"
        "res = MPI.COMM_WORLD.gather(out, root=0)\n"
        "dist.shutdown()\n"
        "if info.rank == 0: print(res)\n"
    )
    assert mpi(3, code).stdout.strip() == "[[1, 2, 3], [2, 3], [3]]"


def test_horovod_can_be_added_after_a_torch_only_init(mpi):
    code = (
        "from ddlcourse import dist\n"
        "a = dist.init(horovod=False); assert not a.horovod\n"
        "b = dist.init(horovod=True); assert b.horovod and b.rank == a.rank\n"
        "import horovod.torch as hvd, torch\n"
        "s = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()\n"
        "dist.shutdown()\n"
        "if b.rank == 0: print(s)\n"
    )
    assert mpi(2, code).stdout.strip() == "2.0"
