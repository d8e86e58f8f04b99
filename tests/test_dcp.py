"""ddlcourse.dcp: FSDP2 + TP on a 2-D mesh equal to serial; DCP saved on 2 ranks, loaded on 4, continues exactly."""
import pytest

from ddlcourse import dcp
from ddlcourse.selfcheck import run_checker
from ddlcourse.exercises.solutions import native_sharding_checkpoints as ex

_2D = """
import torch
from ddlcourse import dist, dcp
dist.init(); torch.set_num_threads(1)
n = torch.distributed.get_world_size()
ref = dcp.train_serial(5)
out = dcp.train_2d(5, dp={dp})
dl = max(abs(a - b) for a, b in zip(out["losses"], ref["losses"]))
dp_ = float((out["params"] - ref["params"]).abs().max())
line = " ".join(str(v) for v in ("RESULT", n, out["mesh"], dl < 1e-5, dp_ < 1e-5, out["local_shapes"]["0.weight"]))
from mpi4py import MPI   # one print on rank 0: the ranks' own prints would interleave
lines = MPI.COMM_WORLD.gather(line, root=0)
if MPI.COMM_WORLD.Get_rank() == 0:
    print("\\n".join(lines))
"""


@pytest.mark.parametrize("n, dp, local", [(2, 1, "(32, 16)"), (4, 2, "(16, 16)")])
def test_fsdp2_with_tensor_parallel_on_a_2d_mesh_equals_serial(mpi, n, dp, local):
    out = mpi(n, _2D.format(dp=dp)).stdout
    lines = [l for l in out.splitlines() if l.startswith("RESULT")]
    assert len(lines) == n, out
    assert all(l == f"RESULT {n} ({dp}, {n // dp}) True True {local}" for l in lines), out


_PHASE = """
import sys, torch
from ddlcourse import dist, dcp
dist.init(); torch.set_num_threads(1)
ckpt = {ckpt!r}
if {load}:
    res = dcp.train_phase(4, 8, load_from=ckpt)
    ref = dcp.train_serial(8)
    print("RESUMED", res["n_ranks"], res["local_rows"], dcp.continues_exactly(res["losses"], ref["losses"][4:]),
          float((res["params"] - ref["params"]).abs().max()) < 1e-5)
else:
    res = dcp.train_phase(0, 4, save_to=ckpt)
    ref = dcp.train_serial(4)
    print("SAVED", res["n_ranks"], res["local_rows"], dcp.continues_exactly(res["losses"], ref["losses"]),
          res["files_written"])
"""


def test_dcp_saved_on_2_ranks_loads_resharded_on_4_and_continues_exactly(mpi, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    out = mpi(2, _PHASE.format(ckpt=ckpt, load=False)).stdout
    assert out.count("SAVED 2 32 True") == 2, out
    assert "['.metadata', '__0_0.distcp', '__1_0.distcp']" in out, out       # one file per rank + metadata
    out = mpi(4, _PHASE.format(ckpt=ckpt, load=True)).stdout
    assert out.count("RESUMED 4 16 True True") == 4, out                     # 16 of 64 rows each: resharded


def test_loading_at_the_wrong_step_is_refused(mpi, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    code = ("import torch\nfrom ddlcourse import dist, dcp\ndist.init()\n"
            f"dcp.train_phase(0, 2, save_to={ckpt!r})\n"
            f"try:\n    dcp.train_phase(3, 4, load_from={ckpt!r})\n"
            "except ValueError as e:\n    print('REFUSED', e)\n")
    assert "REFUSED checkpoint" in mpi(2, code).stdout


def test_shard_range_matches_what_fsdp2_holds(mpi):
    code = ("import torch\nfrom torch import nn\nfrom ddlcourse import dist, dcp\n"
            "from torch.distributed.fsdp import fully_shard\nfrom torch.distributed.device_mesh import init_device_mesh\n"
            "dist.init()\nr, n = torch.distributed.get_rank(), torch.distributed.get_world_size()\n"
            "mesh = init_device_mesh('cpu', (n,))\n"
            "for rows in (10, 3, 64):\n"
            "    m = nn.Linear(5, rows); fully_shard(m, mesh=mesh)\n"
            "    a, b = dcp.shard_range(rows, n, r)\n"
            "    print('ROWS', rows, m.weight.to_local().shape[0] == b - a)\n")
    out = mpi(4, code).stdout
    assert out.count("True") == 12 and "False" not in out, out


def test_shard_range_rules():
    assert [dcp.shard_range(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [dcp.shard_range(3, 4, r) for r in range(4)] == [(0, 1), (1, 2), (2, 3), (3, 3)]
    with pytest.raises(ValueError):
        dcp.shard_range(10, 4, 4)


def test_train_2d_refuses_a_mesh_that_does_not_divide(mpi):
    code = ("from ddlcourse import dist, dcp\ndist.init()\n"
            "try:\n    dcp.train_2d(1, dp=3)\nexcept ValueError as e:\n    print('REFUSED', e)\n")
    assert "REFUSED dp=3 must divide the 2 ranks" in mpi(2, code).stdout


# --------------------------------------------------------------------------- the coding exercise
def test_shard_range_checker_accepts_the_reference():
    assert run_checker("shard_range", dcp.shard_range).ok


@pytest.mark.parametrize("wrong, hint", [
    (ex._floor, "belong to nobody"),
    (ex._remainder_to_last, "remainder to the last rank"),
    (ex._array_split, "array_split"),
    (ex._unclamped, "clamp"),
])
def test_shard_range_checker_names_the_mistake(wrong, hint):
    v = run_checker("shard_range", wrong)
    assert not v.ok and hint in v.message, v.message


_RESUME_AT = """
import torch
from ddlcourse import dist, dcp, integrity
dist.init(); torch.set_num_threads(1)
ckpt = {ckpt!r}
if {load}:
    res = dcp.train_phase(3, 8, load_from=ckpt)
    saved = torch.load(ckpt + "_saved.pt")
    print("RESUMED", torch.equal(res["params_loaded"], saved["params_saved"]),
          integrity.trajectories_agree(saved["losses"][3:], res["losses"], atol=1e-5, exact_steps=5))
else:
    res = dcp.train_phase(0, 8, save_to=ckpt, save_at=3)
    two_d = dcp.train_2d(6, dp=1, first_steps=2, serial=True)
    if torch.distributed.get_rank() == 0:
        torch.save(res, ckpt + "_saved.pt")
        ref = two_d["serial"]
        print("SAVED", len(res["losses"]), res["files_written"] is not None, ref["params_first"].shape == two_d["params_first"].shape,
              dcp.param_gap(two_d["params_first"], ref["params_first"]) < 1e-5, dcp.param_gap(two_d["params"], ref["params"]) < 1e-5,
              integrity.trajectories_agree(ref["losses"], two_d["losses"], atol=1e-5, exact_steps=5))
    else:
        print("OTHER", two_d["serial"] is None)
"""


def test_save_mid_run_loads_the_saved_parameters_exactly_and_serial_runs_on_rank_0(mpi, tmp_path):
    """save_at: the run goes on after saving; the load gives exactly the saved parameters, and the resumed run
    continues the saving one; serial=True trains the reference on rank 0 only."""
    ckpt = str(tmp_path / "ckpt")
    out = mpi(2, _RESUME_AT.format(ckpt=ckpt, load=False)).stdout
    assert "SAVED 8 True True True True True" in out and "OTHER True" in out, out
    out = mpi(4, _RESUME_AT.format(ckpt=ckpt, load=True)).stdout
    assert out.count("RESUMED True True") == 4, out
