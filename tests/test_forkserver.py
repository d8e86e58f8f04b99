"""The test suite's rank fork server (ddlcourse/cluster/forkserver.py): a forked rank behaves as a ``python -c`` rank."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from helpers import RANKS, ROOT, check_on_ranks, forkserver_socket, module_argv, module_command, run_mpi, run_ranks

pytestmark = pytest.mark.mpi

# A rank tells whether it was forked by the server or started by mpiexec's proxy itself from its parent's command
# line (PARENT in the scripts of tests/ranks/forkserver_*.py).


@pytest.fixture(autouse=True)
def server():
    if forkserver_socket() is None:
        pytest.skip("the fork server is off (DDLCOURSE_TEST_FORKSERVER=0)")


def test_a_forked_rank_runs_its_code_as_python_c_does():
    """``run_mpi``'s ``-c CODE``: the code is the text of a script of tests/ranks/, run as a string on purpose."""
    out = run_mpi(3, (RANKS / "forkserver_as_python_c.py").read_text()).stdout.split()
    assert out == ["forked", "True", "['-c']", "__main__", "__main__", "6", "True", "''", os.getcwd()], out


def test_exit_status_and_traceback_reach_mpiexec():
    with pytest.raises(AssertionError, match=r"failed \(3\)"):
        run_mpi(2, "import sys; sys.exit(3)")
    with pytest.raises(AssertionError) as err:
        run_mpi(2, "x = 1\nraise ValueError('boom')\n")
    assert 'File "<string>", line 2, in <module>' in str(err.value) and "ValueError: boom" in str(err.value)
    assert "forkserver.py" not in str(err.value), "the traceback starts at the rank's code"


def test_an_environment_read_at_import_is_not_forked_but_run_fresh():
    out = run_ranks(2, "forkserver_fresh_rank", env={"TORCH_SHOW_CPP_STACKTRACES": "1"}).stdout.split()
    assert out[:2] == ["fresh", "True"], out


def test_a_killed_mpiexec_takes_its_forked_ranks_with_it():
    with pytest.raises(subprocess.TimeoutExpired) as err:
        run_ranks(2, "forkserver_sleeper", timeout=8)
    pids = [int(word) for word in (err.value.stdout or b"").split()]
    assert len(pids) == 2, err.value.stdout
    deadline = time.time() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.time() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")], "a forked rank outlived its mpiexec"


def test_a_module_rank_runs_as_python_m_does():
    """``-m MODULE ARGS``, as MPICluster's engines (and run_ranks) use it: same output, argv and path as
    ``python -m``."""
    from ddlcourse.cluster import forkserver
    from ddlcourse.cluster import find_mpiexec

    sock = forkserver_socket()
    outs = []
    for rank in (forkserver.rank_command(sock, module_argv("forkserver_argv_and_path", "a", "b")),
                 module_command("forkserver_argv_and_path", "a", "b")):
        p = subprocess.run([find_mpiexec(), "-n", "1", *rank], capture_output=True, text=True, timeout=60,
                           cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
        outs.append((p.returncode, p.stdout))
    same = "True ['a', 'b'] True __main__\n"
    assert outs == [(0, same + "True\n"), (0, same + "False\n")], outs


def test_run_ranks_runs_a_module_of_tests_ranks_with_its_arguments():
    """``run_ranks(n, "name", *args)``: ``tests/ranks/name.py`` as ``__main__`` on every rank, from the repository
    root, with the arguments as strings (paths and numbers converted); anything else must be JSON already."""
    out = run_ranks(2, "forkserver_module_rank", "a b", 3, ROOT / "x").stdout
    assert json.loads(out) == [["a b", "3", str(ROOT / "x")], "__main__", True, str(ROOT), str(ROOT)], out
    with pytest.raises(TypeError, match="json.dumps"):
        run_ranks(2, "forkserver_module_rank", {"a": 1})
    with pytest.raises(FileNotFoundError, match="no rank script"):
        run_ranks(2, "no_such_script")


def test_run_ranks_fails_with_the_scripts_traceback():
    """A rank that raises: run_ranks raises with the traceback, which names the script's file and line."""
    script = RANKS / "forkserver_module_rank.py"
    line = script.read_text().splitlines().index('    raise ValueError("boom")') + 1
    with pytest.raises(AssertionError) as err:
        run_ranks(2, "forkserver_module_rank", "fail")
    assert f'File "{script}", line {line}, in <module>' in str(err.value), str(err.value)
    assert "ValueError: boom" in str(err.value) and "forkserver.py" not in str(err.value)


def test_check_on_ranks_needs_every_rank_to_reach_finish():
    """An exercise check passes only if its script printed the line of tests/ranks/_on_ranks.finish."""
    with pytest.raises(AssertionError, match="__main__"):
        check_on_ranks(2, "forkserver_module_rank", "a")


def test_shared_servers_are_reused_restarted_and_stopped(tmp_path):
    from ddlcourse.cluster import forkserver

    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = forkserver.shared((), env, tmp_path)
    assert first is not None and forkserver.shared((), env, tmp_path) == first, "one server per preload and env"
    other = forkserver.shared((), dict(env, OMP_NUM_THREADS="2"), tmp_path)
    assert other not in (None, first), "an import-time variable that differs needs a server of its own"
    (proc, _), = [v for k, v in forkserver._SHARED.items() if v[1] == first]
    proc.kill()
    proc.wait()
    again = forkserver.shared((), env, tmp_path)
    assert again not in (None, first) and not os.path.exists(os.path.dirname(first)), "a dead server is replaced"
    forkserver.stop_shared()
    assert not forkserver._SHARED and not list(tmp_path.iterdir()), "stop_shared leaves no folder"


@pytest.mark.parametrize("unbuffered", [True, False])
def test_a_forked_rank_writes_out_as_python_does(unbuffered):
    """With PYTHONUNBUFFERED, a line printed reaches stdout while the rank still runs (the nanny of a forked
    engine hands its URL over that way); stderr is line-buffered either way, as python's is."""
    import select

    from ddlcourse.cluster import forkserver

    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    p = subprocess.Popen(forkserver.rank_command(forkserver_socket(), module_argv("forkserver_out_err")), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        got = {}
        for name, pipe, wait in (("err", p.stderr, 20), ("out", p.stdout, 20 if unbuffered else 1)):
            ready, _, _ = select.select([pipe], [], [], wait)
            got[name] = os.read(pipe.fileno(), 100) if ready else b""
        assert got == {"err": b"err\n", "out": b"out\n" if unbuffered else b""}, got
    finally:
        p.kill()
        p.wait()
