"""The DDP communication hooks that send CPU buckets through MPI: every mode ($DDLCOURSE_DDP_HOOK = mpi-overlap,
mpi, default) trains as serial on the world and on a subgroup, with several buckets, with gradient accumulation
under no_sync and with find_unused_parameters; DDP's buffer broadcast goes through MPI and equals DDP's own; a
backward that raises leaves no request behind; the hook records which path ran."""
import pytest

from helpers import ROOT, module_command, run_ranks

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [2, 4])
def test_every_mode_trains_as_serial(n):
    allr = eval(run_ranks(n, "mpi_hook_every_mode").stdout.strip().splitlines()[-1])
    seen = set()
    for per_rank in allr:
        for k, res in per_rank.items():
            seen.add(k)
            for hook in ("mpi-overlap", "mpi", "default"):
                d = res[hook]
                assert d["plain"] < 1e-5 and d["accum"] < 1e-5 and d["unused"] < 1e-5, (k, hook, d)
                assert d["cnn_params"] < 1e-6 and d["cnn_buffers"] < 1e-6, (k, hook, d)   # as DDP's own hook
                assert d["pending"] == 0, (k, hook, d)
                if hook == "default":
                    assert not d["registered"] and d["buffer_syncs"] is None, d
                    continue
                assert d["registered"] and d["mode"] == hook, d
                others = {p: c for p, c in d["buckets"].items() if p != hook}
                # several buckets per step, every one through the path of the mode, none left to gloo
                assert d["buckets"][hook] >= 2 * 4 and set(others.values()) == {0}, (k, hook, d)
                # no_sync: only the last micro-batch's backward reduces, so as many buckets as without it
                assert d["accum_buckets"][hook] == d["buckets"][hook], (k, hook, d)
                assert d["waits"] == (4 if hook == "mpi-overlap" else 0), d       # one Waitall per backward
                assert d["buffer_syncs"] == {"mpi": 2 * 4, "default": 0}, d     # float and int64, every forward
            for hook in ("mpi-overlap", "mpi"):
                b = res["boom-" + hook]
                assert b["raised"][0] == "boom" and "Expected to have finished" in b["raised"][1], b
                assert b["ref"] < 1e-5 and b["again"] < 1e-12 and b["pending"] == 0, b
            # overlap: the bucket started before the backward raised was waited for by the next forward
            assert res["boom-mpi-overlap"]["leftovers"] >= 1 and res["boom-mpi"]["leftovers"] == 0, res
            assert res["bcast"] == {"equal": True, "syncs": {"mpi": 4, "default": 0}}, res["bcast"]
    assert seen == ({2, n} if n > 2 else {2})


def test_mode_validates(monkeypatch):
    from ddlcourse.parallel import mpi_hook
    monkeypatch.setenv(mpi_hook.MODE_VAR, "nccl")
    with pytest.raises(ValueError, match=r"DDLCOURSE_DDP_HOOK must be one of 'mpi-overlap', 'mpi', 'default'"):
        mpi_hook.mode()
    with pytest.raises(ValueError, match="'mpi-overlap', 'mpi', 'default', got 'overlap'"):
        mpi_hook.check_mode("overlap")
    monkeypatch.setenv(mpi_hook.MODE_VAR, " Default")
    assert mpi_hook.mode() == "default"
    monkeypatch.setenv(mpi_hook.MODE_VAR, "MPI")
    assert mpi_hook.mode() == "mpi"
    monkeypatch.delenv(mpi_hook.MODE_VAR)
    assert mpi_hook.mode() == "mpi-overlap"          # the default
    assert mpi_hook.MODES[0] == "mpi-overlap"


def test_no_mpi_path_without_torch_distributed():
    import subprocess                                  # a fresh process: another test may have made a group here
    p = subprocess.run(module_command("mpi_hook_no_torch_distributed"), capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert p.stdout.strip() == "ok", p.stderr[-2000:]
