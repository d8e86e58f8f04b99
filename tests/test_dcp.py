"""ddlcourse.dcp: FSDP2 + TP on a 2-D mesh equal to serial; DCP saved on 2 ranks, loaded on 4, continues exactly."""
import pytest

from ddlcourse import dcp
from ddlcourse.selfcheck import run_checker
from ddlcourse.exercises.solutions import native_sharding_checkpoints as ex

from helpers import run_ranks


@pytest.mark.parametrize("n, dp, local", [(2, 1, "(32, 16)"), (4, 2, "(16, 16)")])
def test_fsdp2_with_tensor_parallel_on_a_2d_mesh_equals_serial(n, dp, local):
    out = run_ranks(n, "dcp_fsdp2_tensor_parallel_2d", dp).stdout
    lines = [l for l in out.splitlines() if l.startswith("RESULT")]
    assert len(lines) == n, out
    assert all(l == f"RESULT {n} ({dp}, {n // dp}) True True {local}" for l in lines), out


def test_dcp_saved_on_2_ranks_loads_resharded_on_4_and_continues_exactly(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    out = run_ranks(2, "dcp_phase", ckpt, "save").stdout
    assert out.count("SAVED 2 32 True") == 2, out
    assert "['.metadata', '__0_0.distcp', '__1_0.distcp']" in out, out       # one file per rank + metadata
    out = run_ranks(4, "dcp_phase", ckpt, "load").stdout
    assert out.count("RESUMED 4 16 True True") == 4, out                     # 16 of 64 rows each: resharded


def test_loading_at_the_wrong_step_is_refused(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    assert "REFUSED checkpoint" in run_ranks(2, "dcp_wrong_step", ckpt).stdout


def test_shard_range_matches_what_fsdp2_holds():
    out = run_ranks(4, "dcp_shard_range").stdout
    assert out.count("True") == 12 and "False" not in out, out


def test_shard_range_rules():
    assert [dcp.shard_range(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [dcp.shard_range(3, 4, r) for r in range(4)] == [(0, 1), (1, 2), (2, 3), (3, 3)]
    with pytest.raises(ValueError):
        dcp.shard_range(10, 4, 4)


def test_train_2d_refuses_a_mesh_that_does_not_divide():
    assert "REFUSED dp=3 must divide the 2 ranks" in run_ranks(2, "dcp_train_2d_refuses").stdout


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


def test_save_mid_run_loads_the_saved_parameters_exactly_and_serial_runs_on_rank_0(tmp_path):
    """save_at: the run goes on after saving; the load gives exactly the saved parameters, and the resumed run
    continues the saving one; serial=True trains the reference on rank 0 only."""
    ckpt = str(tmp_path / "ckpt")
    out = run_ranks(2, "dcp_resume_at", ckpt, "save").stdout
    assert "SAVED 8 True True True True True" in out and "OTHER True" in out, out
    out = run_ranks(4, "dcp_resume_at", ckpt, "load").stdout
    assert out.count("RESUMED True True") == 4, out
