"""``python -m ddlcourse check-exercise NAME [FILE]``: check a coding exercise written in a file, from a terminal.

The same checker and the same hints as the notebook's ``check_code``. A distributed exercise runs on ranks that
this command starts itself (``mpiexec -n N``, N from ``--ranks`` or the exercise's first rank count); each rank
loads the whole file, so helper functions written beside the solution come with it. Without FILE it checks the
learner's file under ``exercises/<topic>/<name>.py`` (``--list`` shows them all).
"""
from __future__ import annotations

import argparse
import json
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


def _on_ranks(name: str, path: str) -> int:
    """One rank of a distributed check: load the file, run the checker; rank 0 prints every rank's verdict as one
    JSON line (``VERDICTS [[ok, message], ...]``) for the command that started the ranks."""
    from mpi4py import MPI      # lazy: MPI starts only on the ranks this command launched

    comm = MPI.COMM_WORLD
    try:
        v = selfcheck.run_checker(name, load(name, path))
    except (ValueError, FileNotFoundError) as e:
        v = selfcheck.Verdict(False, str(e))
    verdicts = comm.gather((v.ok, v.message), root=0)
    if comm.Get_rank() == 0:
        print("VERDICTS " + json.dumps(verdicts), flush=True)
    if "ddlcourse.dist" in sys.modules:
        sys.modules["ddlcourse.dist"].shutdown()
    return 0


def check_file(name: str, path: str | Path, ranks: int | None = None, timeout: float | None = None) -> bool:
    """Check the file's solution of ``name``: here for a serial exercise; for a distributed one a rehearsal on
    simulated ranks, then ``ranks`` real ranks that this command starts (mpiexec)."""
    ex = selfcheck._code_exercise(name)
    fn = load(name, path)       # a missing file or function is said here, once, before any rank starts
    if not ex.distributed:
        return selfcheck._say(name, [selfcheck.run_checker(name, fn)], False)
    n = ranks or ex.ranks[0]

    def run_real(shipped, seconds):
        cmd = [find_mpiexec(), "-n", str(n), "-bind-to", "none", "-genv", "OMP_NUM_THREADS", "1",
               sys.executable, "-m", "ddlcourse", "check-exercise", name, str(path), "--on-ranks"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds, env=dict(os.environ))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"no answer from the ranks within {seconds:.0f} s") from None
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("VERDICTS ")), None)
        if line is None:
            raise RuntimeError(f"the ranks ended without a verdict (exit {p.returncode}): {p.stderr[-2000:]}")
        return [selfcheck.Verdict(ok, msg) for ok, msg in json.loads(line[len("VERDICTS "):])]
    return selfcheck.check_on_ranks(name, fn, n, run_real, timeout=timeout)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("name", nargs="?", help="the exercise, as the notebook's check_code names it")
    p.add_argument("file", nargs="?", help="the file with your solution (default: exercises/<topic>/<name>.py)")
    p.add_argument("--ranks", type=int, default=None, help="ranks for a distributed exercise (default: its first)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds the real ranks may take (default: twenty times the rehearsal's, at least 30)")
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
