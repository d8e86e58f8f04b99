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
import sys
import textwrap
import time
import tokenize
import traceback
from pathlib import Path
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
    _load_for(name)
    if name not in EXERCISES:
        _load_all()
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

    __slots__ = ("name", "checker", "distributed", "ranks", "rehearse", "hints")

    def __init__(self, name, checker, distributed, ranks, rehearse=True, hints=None):
        self.name, self.checker, self.distributed, self.ranks = name, checker, distributed, tuple(ranks)
        self.rehearse, self.hints = rehearse, dict(hints or {})

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


def code_exercise(name: str, distributed: bool = False, ranks=(2, 3), rehearse: bool = True, hints=None):
    """Register ``checker(fn, **kwargs) -> Verdict`` for the coding exercise ``name`` (in a checker module).

    The checker calls the learner's function on its own inputs, compares with a reference the package computes,
    and when they differ names the typical mistake it recognises (see :func:`diagnose`).
    ``distributed=True``: the checker runs on every rank of a cluster (it may use MPI or torch.distributed);
    ``ranks``: the world sizes its tests run it on. ``rehearse``: a distributed check runs first on simulated ranks
    (:mod:`ddlcourse.exercises.rehearsal`), which name a deadlock, a mismatched message or a one-rank exception at
    once; False for a checker that needs the real thing (torch's own DDP). ``hints``: what to add to the rehearsal's
    report for a kind of problem (``{"truncated": "..."}``): the exercise's own word on it.
    """
    def deco(checker):
        if name in CODE_EXERCISES and CODE_EXERCISES[name].checker.__module__ != checker.__module__:
            raise ValueError(f"code exercise {name!r} is defined twice")
        CODE_EXERCISES[name] = CodeExercise(name, checker, distributed, ranks, rehearse, hints)
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


_REGISTERS = re.compile(r"""(?:code_exercise|exercise)\(\s*["']([A-Za-z0-9_]+)["']""")


def _module_of(name: str) -> str | None:
    """The checker module that registers ``name``, read from the sources (no import): a rank that checks one
    exercise imports its module only, not all of them."""
    if not _INDEX:
        folder = Path(__file__).resolve().parent / "exercises" / "checkers"
        for f in sorted(folder.glob("*.py")):
            for found in _REGISTERS.findall(f.read_text(encoding="utf-8")):
                _INDEX.setdefault(found, f"{CHECKERS_PACKAGE}.{f.stem}")
    return _INDEX.get(name)


_INDEX: dict = {}


def _load_for(name: str) -> None:
    """Import the checker module of ``name`` (all of them when the index does not know it)."""
    if name in CODE_EXERCISES or name in EXERCISES:
        return
    module = _module_of(name)
    if module is not None:
        importlib.import_module(module)
    if name not in CODE_EXERCISES and name not in EXERCISES:
        _load_all()


def _code_exercise(name: str) -> CodeExercise:
    _load_for(name)
    if name not in CODE_EXERCISES:
        _load_all()
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


def _learner_frame(tb) -> tuple[int, str] | None:
    """``(line, text)`` of the innermost frame of a traceback that is the learner's code: not the course's package,
    not an installed library, not Python's own."""
    package = str(Path(__file__).resolve().parent)
    system = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    found = None
    for frame in traceback.extract_tb(tb):
        f = frame.filename
        if f.startswith(package) or f.startswith(system) or f.startswith("<frozen"):
            continue
        found = (frame.lineno, (frame.line or "").strip())
    return found


_CHECKERS_COMM: list = []       # the checkers' own duplicate of the MPI world (made by run_checker, see below)


def checkers_comm():
    """The checkers' own communicator: a duplicate of ``MPI.COMM_WORLD`` that the learner's code never uses, so
    that a checker telling the ranks what one of them raised cannot meet a collective of the learner's code still
    running on another rank (on a real cluster the two would mix; in a rehearsal the wait shows as what it is).
    Made once per process, by :func:`run_checker` before a distributed checker runs, on every rank at once."""
    if not _CHECKERS_COMM:
        from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
        _CHECKERS_COMM.append(MPI.COMM_WORLD.Dup())
    return _CHECKERS_COMM[0]


def told(error: BaseException | None, comm=None) -> Verdict | None:
    """For a checker that catches the learner's exception so that no rank waits for ever: every rank of ``comm``
    (an mpi4py communicator; default :func:`checkers_comm`) learns whether one raised, and what. Collective.
    Re-raises ``error`` on a rank that raised (its verdict then says what and where); on the others, a verdict
    naming the first rank that raised and its exception; None when no rank raised."""
    said = None
    if isinstance(error, NotImplementedError):
        said = "is not written yet"
    elif error is not None:
        said = raised(error)[len("your function "):]
    every = (comm or checkers_comm()).allgather(said)
    if error is not None:
        raise error
    bad = next(((q, m) for q, m in enumerate(every) if m), None)
    return None if bad is None else Verdict(False, f"your function on rank {bad[0]} {bad[1]}")


def run_checker(name: str, fn, **kwargs) -> Verdict:
    """Run the checker of ``name`` on ``fn`` here (on one rank); an exception in ``fn`` is a verdict too, with the
    learner's line that raised it."""
    ex = _code_exercise(name)
    if ex.distributed:
        checkers_comm()                    # collective: made here, where every rank runs the same line
    try:
        return ex.checker(fn, **kwargs)
    except NotImplementedError:
        return Verdict(False, "not written yet: replace the `raise NotImplementedError` with your code")
    except Exception as e:  # the learner's code raised: say where, not a traceback from the checker
        return Verdict(False, raised(e))


def raised(e: BaseException) -> str:
    """What a verdict says of an exception in the learner's code: ``your function raised ValueError: ... (at line
    12 of your code: ...)``. A checker that catches the learner's exception (to tell the other ranks first) calls
    it too: in a rehearsal it also tells the referee, so that the ranks still waiting for this one hear why."""
    where = _learner_frame(e.__traceback__)
    at = f" (at line {where[0]} of your code: {where[1]})" if where and where[1] else ""
    text = f"your function raised {type(e).__name__}: {e}{at}"
    from ddlcourse.exercises import simworld   # lazy: the exercises layer stands on this module
    world = simworld.current()
    if world is not None:
        world.send(("raised", text))
    return text


def run_shipped(name: str, shipped: dict, kwargs: dict) -> Verdict:
    """On a rank: :func:`run_checker` on the learner's code as :func:`ddlcourse.exercises.rehearsal.ship` packed it
    (by value, with its source lines, so a helper from another cell comes along and an error names its line)."""
    import cloudpickle   # lazy: only the ranks of a check need it

    from ddlcourse.exercises.simworld import install_sources

    install_sources(shipped["sources"])
    return run_checker(name, cloudpickle.loads(shipped["fn"]), **kwargs)


def _say(name: str, verdicts: list, distributed: bool) -> bool:
    """Print the verdict of every rank as one line; True when right on every rank."""
    bad = [(r, v) for r, v in enumerate(verdicts) if not v.ok]
    if not bad:
        print(f"[{name}] correct" + (f" on all {len(verdicts)} ranks" if distributed else ""))
        return True
    r, v = bad[0]
    where = f" (rank {r}{' and others' if len(bad) > 1 else ''})" if distributed else ""
    print(f"[{name}] not yet{where}: {v.message}")
    return False


def rehearse(name: str, fn, n: int, shipped: dict | None = None, limit: float | None = None, **kwargs):
    """The rehearsal of a distributed check on ``n`` simulated ranks: ``(verdicts, rehearsal)``, one verdict per
    rank as a real check gives them, or one verdict for all when a deadlock, a mismatched message or an exception on
    one rank stopped it (what happened, where each rank was, and the exercise's own hint for that kind). ``limit``:
    the seconds after which a rehearsal that has not ended is stopped (default ``rehearsal.TIMEOUT_S``)."""
    from ddlcourse.exercises import rehearsal   # lazy: the exercises layer stands on this module

    r = rehearsal.rehearse(name, fn, n, kwargs, shipped=shipped, timeout=limit or rehearsal.TIMEOUT_S)
    if r.finished_cleanly:
        return [Verdict(ok, m) for _, (ok, m) in sorted(r.verdicts.items())], r
    return [Verdict(False, r.message(_code_exercise(name).hints))], r


def check_on_ranks(name: str, fn, n: int, run_real, recover=None, timeout: float | None = None,
                   **kwargs) -> bool:
    """A distributed check: first the rehearsal on ``n`` simulated ranks (a deadlock, a mismatched message, an
    exception on one rank or a skipped mechanism is named there, in seconds, and never reaches the real ranks),
    then ``run_real(shipped, timeout)`` -> one Verdict per real rank. Past ``timeout`` (default: twenty times the
    rehearsal's time, at least 30 s) the ranks that answered are shown, and ``recover()`` (if given) replaces the
    ranks that did not, saying so. A ``timeout`` given also bounds the rehearsal."""
    from ddlcourse.exercises import rehearsal   # lazy: the exercises layer stands on this module

    ex = _code_exercise(name)
    shipped = rehearsal.ship(fn)
    seconds = 1.0
    if ex.rehearse:
        verdicts, r = rehearse(name, fn, n, shipped=shipped, limit=timeout, **kwargs)
        seconds = r.seconds
        if not r.finished_cleanly:                 # what stopped it is the verdict of all the ranks
            print(f"[{name}] not yet: {verdicts[0].message}")
            return False
        if not r.ok:
            return _say(name, verdicts, True)
    timeout = timeout if timeout is not None else max(30.0, 20 * seconds)
    try:
        verdicts = run_real(shipped, timeout)
    except TimeoutError as e:
        answered = getattr(e, "answered", {})
        said = "; ".join(f"rank {q}: {v.message or 'right'}" for q, v in sorted(answered.items())
                         if isinstance(v, Verdict)) or "none"
        pending = getattr(e, "pending", [])
        print(f"[{name}] not yet: the rehearsal passed, but on the real ranks rank(s) {pending} gave no answer "
              f"within {timeout:.0f} s (answers so far: {said}). A wait that depends on timing or message size?")
        if recover is not None:
            recover()
        return False
    except Exception as e:   # noqa: BLE001 -- a dead engine (ClusterError), or the check could not run
        print(f"[{name}] not yet: the check did not finish on the real ranks: {type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''}")
        if recover is not None:
            recover()
        return False
    return _say(name, verdicts, True)


def check_code(name: str, fn, cluster=None, timeout: float | None = None, **kwargs) -> bool:
    """Check the learner's function ``fn`` for coding exercise ``name``; print the verdict, return it.

    A distributed exercise needs ``cluster`` (an ``MPICluster``): first a rehearsal on as many simulated ranks
    (:func:`check_on_ranks`), then the checker on every rank of the cluster; right only if right on every rank.
    The cluster survives a wrong answer: a check whose real ranks hang or die has them replaced, and says so.
    """
    if not _code_exercise(name).distributed:
        return _say(name, [run_checker(name, fn, **kwargs)], False)
    if cluster is None:
        raise ValueError(f"exercise {name!r} runs on the ranks: pass cluster=c")

    def run_real(shipped, seconds):
        return cluster.run(run_shipped, name, shipped, kwargs, timeout=seconds)

    def recover():
        t0 = time.perf_counter()
        cluster.restart()
        print(f"[{name}] the cluster's engines were replaced ({time.perf_counter() - t0:.1f} s): variables you "
              "set on them with %px are gone; the next check runs on the new ones")
    return check_on_ranks(name, fn, cluster.n, run_real, recover, timeout, **kwargs)


def show_timeline(learner_only: bool = False):
    """The figure of the last rehearsal of this kernel: what each rank did, the first problem in red."""
    from ddlcourse.exercises import rehearsal   # lazy, as above

    last = rehearsal.LAST.get("rehearsal")
    if last is None:
        print("no rehearsal yet: check_code of a distributed exercise makes one")
        return None
    return last.timeline(learner_only=learner_only)


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
