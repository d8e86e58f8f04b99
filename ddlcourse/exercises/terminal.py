"""``python -m ddlcourse check-exercise NAME [FILE]``: check a coding exercise written in a file, from a terminal.

The same checker and the same hints as the notebook's ``check_code``. A distributed exercise runs on ranks that
this command starts itself (``mpiexec -n N``, N from ``--ranks`` or the exercise's first rank count); each rank
loads the whole file, so helper functions written beside the solution come with it. Without FILE it checks the
learner's file under ``exercises/<topic>/<name>.py`` (``--list`` shows them all).
"""
from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
from pathlib import Path

from ddlcourse import selfcheck
from ddlcourse.cluster.launch import find_mpiexec
from ddlcourse.exercises import templates

PROG = "python -m ddlcourse check-exercise"


def load(name: str, path: str | Path):
    """The learner's function or class for ``name``, defined by the file at ``path`` (run as a script)."""
    learner = templates.template(name)[0]
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}: give the file with your {learner}, or leave it out to check "
                                f"{templates.start_path(name)}")
    ns = runpy.run_path(str(path), run_name="__ddlcourse_exercise__")
    if learner not in ns:
        raise ValueError(f"{path} defines no {learner!r}: the checker of {name!r} runs the {learner} of the "
                         "notebook's template, under that name")
    return ns[learner]


def _say(name: str, verdicts: list, distributed: bool) -> bool:
    """Print the verdict as ``check_code`` does; True when right on every rank."""
    bad = [(r, v) for r, v in enumerate(verdicts) if not v.ok]
    if not bad:
        print(f"[{name}] correct" + (f" on all {len(verdicts)} ranks" if distributed else ""))
        return True
    r, v = bad[0]
    where = f" (rank {r}{' and others' if len(bad) > 1 else ''})" if distributed else ""
    print(f"[{name}] not yet{where}: {v.message}")
    return False


def _on_ranks(name: str, path: str) -> int:
    """One rank of a distributed check: load the file, run the checker, rank 0 says the verdict."""
    from mpi4py import MPI      # lazy: MPI starts only on the ranks this command launched

    comm = MPI.COMM_WORLD
    try:
        fn = load(name, path)
        v = selfcheck.run_checker(name, fn)
    except (ValueError, FileNotFoundError) as e:
        v = selfcheck.Verdict(False, str(e))
    verdicts = comm.gather(v, root=0)
    ok = _say(name, verdicts, True) if comm.Get_rank() == 0 else None
    ok = comm.bcast(ok, root=0)
    if "ddlcourse.dist" in sys.modules:
        sys.modules["ddlcourse.dist"].shutdown()
    return 0 if ok else 1


def check_file(name: str, path: str | Path, ranks: int | None = None, timeout: float = 120.0) -> bool:
    """Check the file's solution of ``name`` (on ``ranks`` ranks it starts, if the exercise is distributed)."""
    ex = selfcheck._code_exercise(name)
    if not ex.distributed:
        return _say(name, [selfcheck.run_checker(name, load(name, path))], False)
    n = ranks or ex.ranks[0]
    load(name, path)          # a missing file or function is said here, once, before any rank starts
    cmd = [find_mpiexec(), "-n", str(n), "-bind-to", "none", "-genv", "OMP_NUM_THREADS", "1",
           sys.executable, "-m", "ddlcourse", "check-exercise", name, str(path), "--on-ranks"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        print(f"[{name}] no answer from the ranks after {timeout:.0f} s: a send without its receive, or a "
              "collective that not every rank calls, waits for ever. Check the order of your communication calls.")
        return False
    sys.stdout.write(p.stdout)
    if p.returncode not in (0, 1):
        sys.stdout.write(p.stderr[-3000:])
    return p.returncode == 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("name", nargs="?", help="the exercise, as the notebook's check_code names it")
    p.add_argument("file", nargs="?", help="the file with your solution (default: exercises/<topic>/<name>.py)")
    p.add_argument("--ranks", type=int, default=None, help="ranks for a distributed exercise (default: its first)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a distributed check gives up")
    p.add_argument("--list", action="store_true", help="list the exercises that have a file of their own")
    p.add_argument("--write-starts", action="store_true",
                   help="(instructors) make exercises/<topic>/<name>.py again from the notebooks' templates")
    p.add_argument("--on-ranks", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.write_starts:
        for f in templates.write_starts():
            print(f)
        return 0
    if a.list:
        for name in templates.long_exercises():
            ex = selfcheck._code_exercise(name)
            where = f"on {ex.ranks[0]} ranks" if ex.distributed else "here"
            print(f"{name:<28} {str(templates.start_path(name).relative_to(templates._root())):<60} {where}")
        return 0
    if not a.name:
        p.error("name the exercise (--list shows them)")
    path = a.file or templates.start_path(a.name)
    if a.on_ranks:
        return _on_ranks(a.name, path)
    if a.ranks is not None and a.ranks < 1:
        raise ValueError(f"--ranks must be at least 1, got {a.ranks}")
    return 0 if check_file(a.name, path, a.ranks, a.timeout) else 1
