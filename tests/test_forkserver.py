"""The test suite's rank fork server (ddlcourse/cluster/forkserver.py): a forked rank behaves as a ``python -c`` rank."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import _forkserver_socket, run_mpi

pytestmark = pytest.mark.mpi

# how a rank tells whether it was forked by the server or started by mpiexec's proxy itself
PARENT = "import os\nPARENT = open(f'/proc/{os.getppid()}/cmdline', 'rb').read().replace(b'\\0', b' ').decode()\n"


@pytest.fixture(autouse=True)
def server():
    if _forkserver_socket() is None:
        pytest.skip("the fork server is off (DDLCOURSE_TEST_FORKSERVER=0)")


def test_a_forked_rank_runs_its_code_as_python_c_does():
    code = PARENT + (
        "import sys, random, numpy as np\n"
        "from mpi4py import MPI\n"
        "c = MPI.COMM_WORLD\n"
        "draws = c.gather((random.random(), float(np.random.rand())))\n"
        "total = c.allreduce(c.rank + 1)\n"
        "def f(): pass\n"
        "if c.rank == 0:\n"
        "    print('forked', 'forkserver.py serve' in PARENT, sys.argv, __name__, f.__module__, total,\n"
        "          len(set(draws)) == len(draws), repr(sys.path[0]), os.getcwd())\n"
    )
    out = run_mpi(3, code).stdout.split()
    assert out == ["forked", "True", "['-c']", "__main__", "__main__", "6", "True", "''", os.getcwd()], out


def test_exit_status_and_traceback_reach_mpiexec():
    with pytest.raises(AssertionError, match=r"failed \(3\)"):
        run_mpi(2, "import sys\nsys.exit(3)\n")
    with pytest.raises(AssertionError) as err:
        run_mpi(2, "x = 1\nraise ValueError('boom')\n")
    assert 'File "<string>", line 2, in <module>' in str(err.value) and "ValueError: boom" in str(err.value)
    assert "forkserver.py" not in str(err.value), "the traceback starts at the rank's code"


def test_an_environment_read_at_import_is_not_forked_but_run_fresh():
    code = PARENT + "import torch\nprint('fresh', 'forkserver.py' not in PARENT, torch.get_num_threads())\n"
    out = run_mpi(2, code, env={"TORCH_SHOW_CPP_STACKTRACES": "1"}).stdout.split()
    assert out[:2] == ["fresh", "True"], out


def test_a_killed_mpiexec_takes_its_forked_ranks_with_it():
    with pytest.raises(subprocess.TimeoutExpired) as err:
        run_mpi(2, "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(120)\n", timeout=8)
    pids = [int(word) for word in (err.value.stdout or b"").split()]
    assert len(pids) == 2, err.value.stdout
    deadline = time.time() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.time() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")], "a forked rank outlived its mpiexec"


def test_a_module_rank_runs_as_python_m_does(tmp_path):
    """``-m MODULE ARGS``, as MPICluster's engines use it: same output, argv and path as ``python -m``."""
    from ddlcourse.cluster import forkserver
    from ddlcourse.cluster import find_mpiexec

    sock = _forkserver_socket()
    (tmp_path / "shout.py").write_text(PARENT + (
        "import sys\nprint(sys.argv[0].endswith('shout.py'), sys.argv[1:], sys.path[0] == os.getcwd(), __name__)\n"
        "print('forkserver.py serve' in PARENT)\n"))
    outs = []
    for rank in (forkserver.rank_command(sock, ["-m", "shout", "a", "b"]), [sys.executable, "-m", "shout", "a", "b"]):
        p = subprocess.run([find_mpiexec(), "-n", "1", *rank], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"))
        outs.append((p.returncode, p.stdout))
    same = "True ['a', 'b'] True __main__\n"
    assert outs == [(0, same + "True\n"), (0, same + "False\n")], outs


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
    code = "import sys, time\nprint('out')\nsys.stderr.write('err\\n')\ntime.sleep(60)\n"
    p = subprocess.Popen(forkserver.rank_command(_forkserver_socket(), ["-c", code]), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        got = {}
        for name, pipe, wait in (("err", p.stderr, 20), ("out", p.stdout, 20 if unbuffered else 1)):
            ready, _, _ = select.select([pipe], [], [], wait)
            got[name] = os.read(pipe.fileno(), 100) if ready else b""
        assert got == {"err": b"err\n", "out": b"out\n" if unbuffered else b""}, got
    finally:
        p.kill()
        p.wait()
