"""Helpers that several test modules share (tests/ is on sys.path under pytest: ``from helpers import ...``)."""
from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path


# ----------------------------------------------------------------------------- solutions shown where they should not be
def normal(line: str) -> str:
    line = re.sub(r"\s+#\s.*$", "", line.strip())            # a trailing comment
    return re.sub(r"\s+", " ", line)


def solution_lines(fn) -> list[str]:
    src = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(src)
    drop = {tree.body[0].lineno}
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            drop |= set(range(body[0].lineno, body[0].end_lineno + 1))
    return [normal(l) for i, l in enumerate(src.splitlines(), 1)
            if i not in drop and normal(l) and not l.strip().startswith("#")]


def notebook_cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def cell_source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def shown_solution(nb: Path, solution_lines: list[str], k: int = 3) -> str | None:
    """The first run of ``k`` consecutive solution lines that the notebook shows, or None."""
    runs = {tuple(solution_lines[i:i + k]) for i in range(len(solution_lines) - k + 1)}
    for cell in notebook_cells(nb):
        lines = [normal(l) for l in cell_source(cell).splitlines()]
        lines = [l for l in lines if l and not l.startswith("#") or cell["cell_type"] == "markdown" and l]
        for i in range(len(lines) - k + 1):
            if tuple(lines[i:i + k]) in runs:
                return "\n".join(lines[i:i + k])
    return None


def text_shows(text: str, solution_lines: list[str], k: int = 3) -> str | None:
    """The first run of ``k`` consecutive solution lines in ``text`` (a module's source), or None."""
    runs = {tuple(solution_lines[i:i + k]) for i in range(len(solution_lines) - k + 1)}
    lines = [normal(l) for l in text.splitlines()]
    lines = [l for l in lines if l and not l.startswith("#")]
    return next(("\n".join(lines[i:i + k]) for i in range(len(lines) - k + 1) if tuple(lines[i:i + k]) in runs), None)


# ----------------------------------------------------------------------------- running code on MPI ranks
ROOT = Path(__file__).resolve().parent.parent
RANKS = ROOT / "tests" / "ranks"          # the rank scripts: one module per script, run by run_ranks
RANKS_PACKAGE = "tests.ranks"


def forkserver_socket() -> str | None:
    """This process's rank fork server (ddlcourse/cluster/forkserver.py), started on first use; None if it will not.

    DDLCOURSE_TEST_FORKSERVER=0 turns it off: every rank is then a fresh ``python``."""
    import tempfile

    from ddlcourse.cluster import forkserver

    if os.environ.get("DDLCOURSE_TEST_FORKSERVER", "1") == "0":
        return None
    env = dict(os.environ, OMP_NUM_THREADS="1")   # the ranks get -genv OMP_NUM_THREADS 1
    env.pop("PYTHONUNBUFFERED", None)
    return forkserver.shared(forkserver.PRELOAD, env, tempfile.gettempdir(), wait=120)


def _mpiexec(n: int, argv: list[str], timeout: float, env: dict | None):
    """``mpiexec -n n python ARGV`` from the repository root, each rank forked from this process's fork server
    (or a fresh ``python ARGV`` without one); raise with the tails of stdout and stderr on failure."""
    from ddlcourse.cluster import find_mpiexec
    from ddlcourse.cluster import forkserver

    sock = forkserver_socket()
    rank = [sys.executable, *argv] if sock is None else forkserver.rank_command(sock, argv)
    cmd = [find_mpiexec(), "-n", str(n), "-bind-to", "none", "-genv", "OMP_NUM_THREADS", "1", *rank]
    full_env = dict(os.environ, **(env or {}))
    if "PYTHONUNBUFFERED" not in (env or {}):
        # Unbuffered, print() writes its arguments one by one and the ranks' words interleave in mpiexec's
        # stdout ("RESUMEDRESUMED 4 ..."); block-buffered, each rank's output leaves in whole writes.
        full_env.pop("PYTHONUNBUFFERED", None)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)
    if p.returncode != 0:
        raise AssertionError(f"mpiexec -n {n} failed ({p.returncode}):\nSTDOUT:\n{p.stdout[-4000:]}\n"
                             f"STDERR:\n{p.stderr[-4000:]}")
    return p


def run_mpi(n: int, code: str, timeout: float = 240, env: dict | None = None):
    """Run ``python -c code`` on ``n`` ranks with the venv's mpiexec; raise with output on failure.

    For a one-line ``code`` only (and for the tests of the ``-c`` path itself): a script of more lines is a
    module in tests/ranks/, run by :func:`run_ranks`. Each rank is forked from this worker's fork server, which
    has imported torch once (ddlcourse/cluster/forkserver.py says what it keeps and what it refuses); without
    one, it is a fresh ``python -c code``."""
    return _mpiexec(n, ["-c", code], timeout, env)


def _argument(a) -> str:
    if isinstance(a, (str, os.PathLike)):
        return os.fspath(a)
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return str(a)
    raise TypeError(f"a rank script's argument is a string, a path or a number, not {a!r}: pass json.dumps(...)")


def module_command(module: str, *args) -> list[str]:
    """``python -m tests.ranks.MODULE ARGS``: the command line of a script of tests/ranks/ in a process of its
    own (not under mpiexec). Run it with ``cwd=ROOT``: ``-m`` finds ``tests.ranks`` from the working folder."""
    return [sys.executable, *module_argv(module, *args)]


def module_argv(module: str, *args) -> list[str]:
    """``["-m", "tests.ranks.MODULE", *ARGS]``, checked: the module's file exists."""
    if not (RANKS / f"{module}.py").is_file():
        raise FileNotFoundError(f"no rank script {RANKS / module}.py")
    return ["-m", f"{RANKS_PACKAGE}.{module}", *map(_argument, args)]


def run_ranks(n: int, module: str, *args, timeout: float = 240, env: dict | None = None):
    """Run the script ``tests/ranks/<module>.py`` on ``n`` ranks, with ``args`` as its ``sys.argv[1:]``; return
    the ``CompletedProcess``, or raise with the tails of stdout and stderr if any rank fails.

    Each rank is ``python -m tests.ranks.<module> ARGS`` in the repository root (the working folder of every
    rank, as for :func:`run_mpi`), forked from the same fork server as ``run_mpi``'s ranks: the server's client
    runs ``-c CODE`` or ``-m MODULE ARGS`` only (not a file path), and ``-m`` puts the working folder first on
    ``sys.path`` as ``python -m`` does, so ``tests.ranks`` is found there (``tests`` is a namespace package:
    it has no ``__init__.py``, and must not get one, or pytest would name the test modules ``tests.test_x``).
    The module runs as ``__main__``; a failure's traceback names its file and line. Arguments are strings
    (paths and numbers are converted; pass structured values as ``json.dumps(...)``)."""
    return _mpiexec(n, module_argv(module, *args), timeout, env)


def check_on_ranks(n: int, module: str, *args, **kwargs):
    """Run the exercise check ``tests/ranks/<module>.py`` on ``n`` ranks (:func:`run_ranks`); it passes only if
    every rank ran it to the end: the script imports what it uses from ``tests.ranks._on_ranks`` (``RANK``,
    ``run_checker``, ``reject``, ``reject_somewhere``) and calls its ``finish()`` last."""
    p = run_ranks(n, module, *args, **kwargs)
    assert f"checked on ranks {list(range(n))}" in p.stdout, p.stdout
    return p


# ----------------------------------------------------------------------------- the device a case puts its work on
def spy_on_the_device(monkeypatch, model_cls):
    """Record what goes through ``ctx.to``, and check every forward of ``model_cls`` against it.

    On this CPU machine ``ctx.to`` moves nothing, so a case that forgets it would still run here and crash (or
    train on the CPU) on a GPU node. Instead: every tensor ``ctx.to`` returns is remembered (weakly, by its
    storage), and a forward pre-hook notes, for each call of the model, whether its input is one of them (or a
    view of one). Returns ``(moved_modules, checks, handle)``; ``checks`` holds one bool per forward, and
    ``handle.remove()`` takes the hook off.
    """
    import weakref

    import torch

    from ddlcourse import training
    moved, moved_modules, checks = {}, [], []
    original = training.RunContext.to

    def to(self, obj, non_blocking=False):
        out = original(self, obj, non_blocking)
        stack = [out]
        while stack:
            o = stack.pop()
            if torch.is_tensor(o):
                moved[o.untyped_storage().data_ptr()] = weakref.ref(o)
            elif isinstance(o, torch.nn.Module):
                moved_modules.append(type(o).__name__)
            elif isinstance(o, (list, tuple)):
                stack.extend(o)
        return out

    def pre_hook(module, args):
        if isinstance(module, model_cls):
            for a in args:
                if torch.is_tensor(a) and a.device.type != "meta":     # meta: memory estimates, no data
                    ref = moved.get(a.untyped_storage().data_ptr())
                    checks.append(ref is not None and ref() is not None
                                  and all(p.device == a.device for p in module.parameters()))

    monkeypatch.setattr(training.RunContext, "to", to)
    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    return moved_modules, checks, handle


# ----------------------------------------------------------------------------- reading code with ast
def top_level_functions(tree: ast.Module):
    """``(name, node)`` of the top-level functions and methods (``Class.method``) of a module; nested functions are
    checked with their enclosing function."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


# ----------------------------------------------------------------------------- "notebook NN" in the course's prose
# "notebook 05", "notebooks 04-05", "notebooks 00 (clusters), 01 (SGD) and 02 (batch size)"
_NEXT = r"\s*(?:\([^()]*\))?\s*(?:[–-]|,|and|or)\s*(\d\d[a-f]?)\b(?!\s*(?:GB|GiB|MB|%|ms|s\b|×|x\b))"
NOTEBOOK_REF = re.compile(r"\b[Nn]otebooks?\s+(\d\d[a-f]?)\b((?:" + _NEXT.replace("(\\d", "(?:\\d", 1) + r")*)")


def notebook_numbers(first: str, rest: str) -> list[str]:
    """The notebooks a match of :data:`NOTEBOOK_REF` names: ``notebook_numbers(m.group(1), m.group(2) or "")``
    (a range "04-06" gives 04, 05 and 06)."""
    nums = [first]
    for sep, n in re.findall(r"\s*(?:\([^()]*\))?\s*([–-]|,|and|or)\s*(\d\d[a-f]?)", rest):
        if sep in "–-" and n.isdigit() and nums[-1].isdigit():
            nums += [f"{k:02d}" for k in range(int(nums[-1]) + 1, int(n) + 1)]
        else:
            nums.append(n)
    return nums


def need_chromium() -> None:
    """Chromium for a browser test: installed by env/install_chromium.sh if missing; without it the test fails in
    CI, where the browser test must run, and is skipped elsewhere."""
    import pytest
    from instructor import browser
    if browser.find_chromium() is None:
        subprocess.run(["bash", str(ROOT / "env" / "install_chromium.sh")], check=False, timeout=600)
    if browser.find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium could not be installed; the browser test must run in CI")
        pytest.skip("no Chromium on this machine (env/install_chromium.sh could not install it)")
