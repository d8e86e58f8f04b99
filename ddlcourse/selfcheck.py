"""Self-checks for the exercises at the end of each notebook.

A check compares a learner's answer with a reference computed here (never stored as a bare literal
in the notebook) and prints a verdict with a hint, in the spirit of karpathy's ``cmp``::

    from ddlcourse.selfcheck import check
    check("allreduce_sum", my_answer, n_ranks=4)

The exercises live in three places, named by topic (see :mod:`ddlcourse.exercises`): what the learner starts
from (the notebooks' build-it cells, and ``exercises/<topic>/<name>.py`` for the terminal), the checkers
(``ddlcourse/exercises/checkers/<topic>.py``) and the reference solutions (``ddlcourse/exercises/solutions/``).

A checker module registers the reference *answers* of the notebook's questions with ``@exercise``, and a
*checker* for each coding exercise with ``@code_exercise``: it runs the learner's function, compares with a
reference the package computes (MPI's own allreduce, the serial model, ...) and names the typical mistake it
sees::

    check_code("ring_allreduce", my_ring_allreduce, cluster=c)   # runs on every rank of c

A solution module registers the reference *solution* a learner would write with ``@reference``, and the typical
mistakes its checker must name, as functions with one mistake each. :func:`solution` shows a reference to a
learner who is stuck; the tests run every mistake through its checker.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import io
import json
import os
import pkgutil
import re
import textwrap
import tokenize
from typing import Callable

import numpy as np
import torch.distributed as tdist

# name -> (reference(**kwargs) -> answer, hint)
EXERCISES: dict[str, tuple[Callable, str]] = {}


def exercise(name: str, hint: str):
    """Register ``fn`` as the reference answer of exercise ``name``."""
    def deco(fn):
        if name in EXERCISES and EXERCISES[name][0].__module__ != fn.__module__:
            raise ValueError(f"exercise {name!r} is defined twice ({EXERCISES[name][0].__module__} and {fn.__module__})")
        EXERCISES[name] = (fn, hint)
        return fn
    return deco


def _close(a, b, rtol, atol) -> bool:
    try:
        return bool(np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rtol, atol=atol))
    except (TypeError, ValueError):
        return a == b


def check(name: str, answer, rtol: float = 1e-4, atol: float = 1e-8, **kwargs) -> bool:
    """Print whether ``answer`` is right for exercise ``name`` and return it as a bool."""
    _load_all()
    if name not in EXERCISES:
        raise KeyError(f"no exercise {name!r}; known: {', '.join(sorted(EXERCISES))}")
    ref, hint = EXERCISES[name]
    if answer is None or answer is Ellipsis:
        print(f"[{name}] not answered yet. Hint: {hint}")
        return False
    ok = _close(answer, ref(**kwargs), rtol, atol)
    print(f"[{name}] {'correct' if ok else 'not quite'}" + ("" if ok else f". Hint: {hint}"))
    return ok


CHECKERS_PACKAGE, SOLUTIONS_PACKAGE = "ddlcourse.exercises.checkers", "ddlcourse.exercises.solutions"


def _load_all(package: str = CHECKERS_PACKAGE):
    """Import every module of ``package`` (the checkers: each registers its notebook's answers and checkers; the
    solutions: each registers its references). Lazy: every such module imports this one, and they load half the
    package."""
    pkg = importlib.import_module(package)
    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{m.name}")


# --------------------------------------------------------------------------- exercises where the learner writes code
class Verdict:
    """A checker's answer: ``ok`` and a message that says what is wrong (not only "not quite")."""

    __slots__ = ("ok", "message")

    def __init__(self, ok: bool, message: str = ""):
        self.ok, self.message = bool(ok), message

    def __repr__(self) -> str:
        return f"Verdict(ok={self.ok}, message={self.message!r})"


def order_verdict(got: list, ref: list, where: str, mistakes, count_hint: str) -> "Verdict | None":
    """For checkers of an order of operations (a pipeline schedule): None when ``got == ref``; else a Verdict
    naming the first known mistake (``mistakes``: pairs of the order that mistake gives and its hint) that
    produces ``got``, or saying that operations are missing or extra (``count_hint``), or showing both orders."""
    if got == ref:
        return None
    for wrong, hint in mistakes:
        if got == wrong:
            return Verdict(False, f"{where}: {hint}")
    if sorted(got) != sorted(ref):
        return Verdict(False, f"{where}: {count_hint}; expected {' '.join(ref)}, got {' '.join(got)}")
    return Verdict(False, f"{where}: expected {' '.join(ref)}, got {' '.join(got)}")


class CodeExercise:
    """A registered coding exercise: its checker and where it runs; for a "build it" exercise also the reference
    solution a learner would write and the typical mistakes its checker must name (from its solution module)."""

    __slots__ = ("name", "checker", "distributed", "ranks")

    def __init__(self, name, checker, distributed, ranks):
        self.name, self.checker, self.distributed, self.ranks = name, checker, distributed, tuple(ranks)

    @property
    def solution(self) -> Callable | None:
        """The reference solution (None where none is registered)."""
        return _reference(self.name)[0]

    @property
    def mistakes(self) -> tuple:
        """Pairs ``(wrong_fn, hint_fragment)``: each function has one typical mistake, which the checker must reject
        with a message containing ``hint_fragment``."""
        return _reference(self.name)[1]


CODE_EXERCISES: dict[str, CodeExercise] = {}
SOLUTIONS: dict[str, tuple[Callable, tuple]] = {}     # name -> (reference solution, typical mistakes)


def code_exercise(name: str, distributed: bool = False, ranks=(2, 3)):
    """Register ``checker(fn, **kwargs) -> Verdict`` for the coding exercise ``name`` (in a checker module).

    The checker calls the learner's function on its own inputs, compares with a reference the package computes,
    and when they differ names the typical mistake it recognises (see :func:`diagnose`).
    ``distributed=True``: the checker runs on every rank of a cluster (it may use MPI or torch.distributed);
    ``ranks``: the world sizes its tests run it on.
    """
    def deco(checker):
        if name in CODE_EXERCISES and CODE_EXERCISES[name].checker.__module__ != checker.__module__:
            raise ValueError(f"code exercise {name!r} is defined twice")
        CODE_EXERCISES[name] = CodeExercise(name, checker, distributed, ranks)
        return checker
    return deco


def reference(name: str, mistakes=()):
    """Register ``fn`` as the reference solution of coding exercise ``name`` (in a solution module), with the
    signature of the notebook's template (:func:`solution` shows it). ``mistakes``: pairs ``(wrong_fn,
    hint_fragment)``, functions with one typical mistake each, which the checker must reject with a message
    containing ``hint_fragment`` (the tests run every one of them)."""
    def deco(fn):
        if name in SOLUTIONS and SOLUTIONS[name][0].__module__ != fn.__module__:
            raise ValueError(f"reference solution {name!r} is defined twice")
        SOLUTIONS[name] = (fn, tuple(mistakes))
        return fn
    return deco


def _code_exercise(name: str) -> CodeExercise:
    _load_all()
    if name not in CODE_EXERCISES:
        raise KeyError(f"no coding exercise {name!r}; known: {', '.join(sorted(CODE_EXERCISES))}")
    return CODE_EXERCISES[name]


def _reference(name: str) -> tuple:
    """``(solution, mistakes)`` of ``name``, loading the solution modules on first use; ``(None, ())`` if none."""
    _load_all(SOLUTIONS_PACKAGE)
    return SOLUTIONS.get(name, (None, ()))


SOLUTIONS_VAR = "DDLCOURSE_SOLUTIONS"      # "hidden": solution() shows none (a class before its debrief)


def solutions_hidden() -> bool:
    return os.environ.get(SOLUTIONS_VAR, "").strip().lower() == "hidden"


def solution(name: str) -> str:
    """Print the reference solution of coding exercise ``name`` (for a learner who is stuck) and return it; in a
    class whose instructor keeps the solutions until the debrief (``$DDLCOURSE_SOLUTIONS=hidden``), say so."""
    ex = _code_exercise(name)
    if ex.solution is None:
        raise KeyError(f"coding exercise {name!r} has no registered solution")
    if solutions_hidden():
        print(f"[{name}] the solutions are kept until the debrief in this class ({SOLUTIONS_VAR}=hidden): read the "
              "checker's hint again, or ask your instructor")
        return ""
    src = textwrap.dedent(inspect.getsource(ex.solution))
    top = ast.parse(src).body[0]                  # from its `def` or `class` line: no @reference(...) above it
    src = "\n".join(src.splitlines()[top.lineno - 1:]) + "\n"
    print(src)
    return src


def logical_lines(fn) -> int:
    """Logical lines of code in the body of function or class ``fn``: no blank lines, comments, docstrings,
    decorators or the ``def``/``class`` line itself."""
    src = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(src)
    doc_lines = {node.body[0].lineno for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module))
                 and node.body and isinstance(node.body[0], ast.Expr)
                 and isinstance(getattr(node.body[0], "value", None), ast.Constant)
                 and isinstance(node.body[0].value.value, str)}
    top = tree.body[0]
    skip = doc_lines | {top.lineno} | {d.lineno for d in getattr(top, "decorator_list", [])}
    return len(_logical_line_starts(src) - skip)


def _logical_line_starts(src: str) -> set[int]:
    """The line on which each logical line of ``src`` starts."""
    starts, begin = set(), True
    for t in tokenize.generate_tokens(io.StringIO(src).readline):
        if t.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        if t.type == tokenize.NEWLINE:
            begin = True
        elif begin:
            starts.add(t.start[0])
            begin = False
    return starts


_CHECK_CODE_CALL = re.compile(r"""(?:check_code|use_checked)\(\s*["']([A-Za-z0-9_]+)["']""")


def exercises(path: str) -> list[tuple[str, int]]:
    """The coding exercises of a notebook or lab (``path`` to its .ipynb), in order, as ``(name, lines)``:
    ``lines`` is the number of logical lines of the reference solution (0 where none is registered)."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    names = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for name in _CHECK_CODE_CALL.findall(src):
            if name not in names:
                names.append(name)
    out = []
    for name in names:
        ex = _code_exercise(name)
        out.append((name, logical_lines(ex.solution) if ex.solution is not None else 0))
    return out


def agreed(v: Verdict, comm=None) -> Verdict:
    """One verdict on every rank of ``comm`` (an mpi4py communicator; default the world), for a checker that
    runs on every rank: wrong everywhere as soon as one rank is wrong (a mistake at the edges of a ring or a
    pipeline can leave the other ranks right). A wrong rank keeps its own message; the others say the first
    wrong rank's, as ``on rank q: ...``. Collective: every rank of ``comm`` must call it."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    every = (comm or MPI.COMM_WORLD).allgather((v.ok, v.message))
    bad = next(((q, m) for q, (ok, m) in enumerate(every) if not ok), None)
    if v.ok and bad is not None:
        return Verdict(False, f"on rank {bad[0]}: {bad[1]}")
    return v


def diagnose(answer, reference, mistakes: dict | None = None, rtol: float = 1e-5, atol: float = 1e-7,
             what: str = "the result") -> Verdict:
    """Right when ``answer`` matches ``reference``; else the hint of the first mistake it matches.

    ``mistakes`` maps a hint ("you summed the gradients; divide by the number of ranks") to the output that
    mistake produces on the same inputs.
    """
    def same(a, b) -> bool:
        try:
            return np.shape(a) == np.shape(b) and _close(a, b, rtol, atol)
        except ValueError:          # ragged lists
            return False

    if same(answer, reference):
        return Verdict(True)
    for hint, wrong in (mistakes or {}).items():   # a known mistake may change the shape (a dropped batch)
        if same(answer, wrong):
            return Verdict(False, hint)
    if np.shape(answer) != np.shape(reference):
        return Verdict(False, f"{what} has shape {np.shape(answer)}, expected {np.shape(reference)}")
    try:
        err = float(np.max(np.abs(np.asarray(answer, dtype=float) - np.asarray(reference, dtype=float))))
        return Verdict(False, f"{what} differs from the reference by up to {err:.3g}")
    except (TypeError, ValueError):
        return Verdict(False, f"{what} is {answer!r}, expected {reference!r}")


def run_checker(name: str, fn, **kwargs) -> Verdict:
    """Run the checker of ``name`` on ``fn`` here (on one rank); an exception in ``fn`` is a verdict too."""
    checker = _code_exercise(name).checker
    try:
        return checker(fn, **kwargs)
    except NotImplementedError:
        return Verdict(False, "not written yet: replace the `raise NotImplementedError` with your code")
    except Exception as e:  # the learner's code raised: say where, not a traceback from the checker
        return Verdict(False, f"your function raised {type(e).__name__}: {e}")


def check_code(name: str, fn, cluster=None, timeout: float = 120.0, **kwargs) -> bool:
    """Check the learner's function ``fn`` for coding exercise ``name``; print the verdict, return it.

    A distributed exercise needs ``cluster`` (an ``MPICluster``): the checker runs on every rank and the
    exercise is right only if it is right on every rank.
    """
    distributed = _code_exercise(name).distributed
    if distributed:
        if cluster is None:
            raise ValueError(f"exercise {name!r} runs on the ranks: pass cluster=c")
        try:
            verdicts = cluster.run(run_checker, name, fn, timeout=timeout, **kwargs)
        except TimeoutError:
            print(f"[{name}] no answer from the ranks after {timeout:.0f} s: a send without its receive, or a "
                  "collective that not every rank calls, waits for ever. Restart the cluster and check the order "
                  "of your communication calls.")
            return False
    else:
        verdicts = [run_checker(name, fn, **kwargs)]
    bad = [(r, v) for r, v in enumerate(verdicts) if not v.ok]
    if not bad:
        print(f"[{name}] correct" + (f" on all {len(verdicts)} ranks" if distributed else ""))
        return True
    r, v = bad[0]
    where = f" (rank {r}{' and others' if len(bad) > 1 else ''})" if distributed else ""
    print(f"[{name}] not yet{where}: {v.message}")
    return False


def use_checked(name: str, fn, cluster=None, timeout: float = 120.0, **kwargs):
    """For a lab that runs on the learner's code: check ``fn`` as :func:`check_code` does and return it when it
    is right; else return the package's reference solution and say so, so the lab still runs top to bottom."""
    if check_code(name, fn, cluster=cluster, timeout=timeout, **kwargs):
        print(f"[{name}] the lab runs on your {getattr(fn, '__name__', 'code')}")
        return fn
    print(f"[{name}] the lab runs on the package's reference until yours passes"
          + ("" if solutions_hidden() else f" (selfcheck.solution({name!r}) shows it)"))
    return _code_exercise(name).solution


class AllReduceSpy:
    """``with AllReduceSpy() as spy:`` sees, without changing them, the calls of ``torch.distributed.all_reduce``:
    the checkers' one way to tell *when* and *how* a learner's code communicates.

    Set ``spy.watching`` around the part that matters (during backward, inside a communication hook). For the
    calls made while watching, ``sent`` lists each message's ``(dtype, bytes)``, ``blocking`` counts those not
    started with ``async_op=True`` and ``waits`` the ``.wait()`` on their handles made while still watching.
    ``launched`` says, for every call, whether it was made while watching.
    """

    def __init__(self):
        self.watching = False
        self.calls: list = []                 # (watching, dtype, bytes) of every call
        self.blocking = self.waits = 0

    @property
    def launched(self) -> list[bool]:
        return [w for w, _, _ in self.calls]

    @property
    def sent(self) -> list[tuple]:
        return [(dtype, nbytes) for w, dtype, nbytes in self.calls if w]

    def __enter__(self):
        spy, self.real = self, tdist.all_reduce

        class Handle:
            def __init__(self, work):
                self._work = work

            def wait(self, *a, **k):
                spy.waits += spy.watching
                return self._work.wait(*a, **k)

            def __getattr__(self, name):
                return getattr(self._work, name)

        def all_reduce(tensor, *a, async_op=False, **k):
            spy.calls.append((spy.watching, tensor.dtype, tensor.numel() * tensor.element_size()))
            spy.blocking += spy.watching and not async_op
            work = spy.real(tensor, *a, async_op=async_op, **k)
            return Handle(work) if async_op else work

        tdist.all_reduce = all_reduce
        return self

    def __exit__(self, *exc):
        tdist.all_reduce = self.real
