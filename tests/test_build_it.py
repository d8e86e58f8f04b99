"""The "build it" exercises: in every chapter and lab the learner writes the mechanism, and a checker runs it.

For every coding exercise registered with a reference solution (``selfcheck.code_exercise(solution=...)``):
* for a distributed one, on each world size in its ``ranks``: the rehearsal (simulated ranks, where a learner's
  check meets a mistake first) rejects each registered mistake with a message that names it and accepts the
  solution, and on real ranks the checker accepts the solution and says "not written yet" for the notebook's own
  template; for a serial one, the same on one rank;
* the template in the notebook has the solution's signature;
* no notebook shows three consecutive lines of the solution of one of its own exercises.
And every concept notebook after 02, and every lab, has an exercise whose solution has 10 or more logical lines.

``DDLCOURSE_EXERCISES=name,name`` limits the checks on ranks to those exercises (to iterate on one).
"""
from __future__ import annotations

import inspect
import json
import os
import textwrap
from pathlib import Path

import pytest

from ddlcourse import selfcheck as sc
from ddlcourse.exercises import templates

from helpers import ROOT, run_ranks, shown_solution, solution_lines, text_shows

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))
WARM_UPS = {"00_setup_check", "01_sgd", "02_batch_size"}     # the notebooks before the first mechanism
MIN_LINES, MIN_EXERCISES = 10, 30
# the modules of ddlcourse/exercises/ beside checkers/ and solutions/: they hold no exercise
EXERCISE_MACHINERY = {"__init__.py", "templates.py", "terminal.py", "rehearsal.py", "referee.py", "simranks.py",
                      "simworld.py", "simmpi.py", "simtorch.py", "wrong.py"}


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _build_it() -> dict[str, sc.CodeExercise]:
    sc._load_all()
    return {n: ex for n, ex in sc.CODE_EXERCISES.items() if ex.solution is not None and not n.startswith("_")}


def _where() -> dict[str, Path]:
    """exercise name -> the notebook that asks for it."""
    out = {}
    for nb in NOTEBOOKS:
        for name, _ in sc.exercises(str(nb)):
            out.setdefault(name, nb)
    return out


def template_of(name: str, nb: Path) -> tuple[str, str]:
    """(the name of the learner's function or class, a script defining it with the notebook's imports)."""
    return templates.script(name, nb.parent.parent)


def _params(obj) -> list[str]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    return [p for p in inspect.signature(target).parameters if p != "self"]


# ----------------------------------------------------------------------------- what every notebook has
def test_every_chapter_and_lab_has_a_build_it_exercise():
    found = {nb.stem: sc.exercises(str(nb)) for nb in NOTEBOOKS}
    missing = [stem for stem, exs in found.items()
               if stem not in WARM_UPS and not any(lines >= MIN_LINES for _, lines in exs)]
    assert not missing, f"no coding exercise of {MIN_LINES}+ lines of reference: {missing}"
    total = sum(lines >= MIN_LINES for exs in found.values() for _, lines in exs)
    assert total >= MIN_EXERCISES, f"{total} build-it exercises, want {MIN_EXERCISES}"


def test_no_notebook_shows_the_solution_of_its_own_exercise():
    where = _where()
    shown = {}
    for name, ex in _build_it().items():
        if name in where:
            run = shown_solution(where[name], solution_lines(ex.solution))
            if run:
                shown[f"{where[name].name}:{name}"] = run
    assert not shown, f"notebooks that show 3+ consecutive lines of their own solution: {shown}"


def test_checkers_and_solutions_live_apart():
    """The checkers (ddlcourse/exercises/checkers/) hold no reference solution, not even three of its lines; every
    reference is registered from ddlcourse/exercises/solutions/, by topic."""
    sc._load_all()
    sc._load_all(sc.SOLUTIONS_PACKAGE)
    assert all(ex.checker.__module__.startswith(sc.CHECKERS_PACKAGE + ".") for ex in sc.CODE_EXERCISES.values()
               if not ex.name.startswith("_"))
    checkers = {f.name: f.read_text() for f in (ROOT / "ddlcourse" / "exercises" / "checkers").glob("*.py")}
    found = {}
    for name, (fn, _) in sc.SOLUTIONS.items():
        assert fn.__module__.startswith(sc.SOLUTIONS_PACKAGE + "."), f"{name}: its solution is in {fn.__module__}"
        for file, text in checkers.items():
            run = text_shows(text, solution_lines(fn))
            if run:
                found[f"{file}:{name}"] = run
    assert not found, f"checker modules that contain 3+ consecutive lines of a reference solution: {found}"
    outside = {f.name for f in (ROOT / "ddlcourse" / "exercises").glob("*.py")} - EXERCISE_MACHINERY
    assert not outside, f"exercise modules outside checkers/ and solutions/: {sorted(outside)}"


def test_the_rule_finds_a_solution_pasted_into_a_checker():
    fn = sc.CODE_EXERCISES["ring_allreduce"].solution
    assert text_shows("import numpy\n" + textwrap.dedent(inspect.getsource(fn)), solution_lines(fn))


def test_shown_solution_finds_a_pasted_solution(tmp_path):
    fn = sc.CODE_EXERCISES["ring_allreduce"].solution if "ring_allreduce" in _build_it() else solution_lines
    nb = tmp_path / "x.ipynb"
    body = textwrap.dedent(inspect.getsource(fn))
    nb.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": "```python\n" + body + "```"}]}))
    assert shown_solution(nb, solution_lines(fn))


def test_templates_have_the_solutions_signature():
    where = _where()
    for name, ex in _build_it().items():
        if name not in where:
            continue
        learner, script = template_of(name, where[name])
        ns: dict = {}
        exec(compile(script, f"<template of {name}>", "exec"), ns)
        assert _params(ns[learner]) == _params(ex.solution), (name, _params(ns[learner]), _params(ex.solution))


def test_every_distributed_build_it_says_how_it_is_checked():
    """The text before each distributed build-it cell tells the learner that the check rehearses the code on
    simulated ranks first, how to see what each rank did, and that helpers from other cells travel along."""
    import re

    dist = {n for n, ex in _build_it().items() if ex.distributed}
    missing = []
    for nb in NOTEBOOKS:
        cells = _cells(nb)
        for i, cell in enumerate(cells):
            names = re.findall(r"(?:check_code|use_checked)\(\s*['\"](\w+)['\"]", _src(cell))
            if cell["cell_type"] != "code" or not set(names) & dist:
                continue
            md = next(_src(c) for c in reversed(cells[:i]) if c["cell_type"] == "markdown")
            if not all(w in md for w in ("simulated ranks", "show_timeline()", "travel")):
                missing.append(f"{nb.name} cell {i} ({names[0]})")
    assert not missing, f"distributed build-it cells whose text does not say how they are checked: {missing}"


def test_every_build_it_exercise_is_asked_for_and_names_three_mistakes():
    where = _where()
    for name, ex in _build_it().items():
        assert name in where, f"{name}: registered with a solution but no notebook or lab asks for it"
        assert len(ex.mistakes) >= 3, f"{name}: {len(ex.mistakes)} typical mistakes registered, want 3 or more"


# ----------------------------------------------------------------------------- the checkers, on ranks
def _cases(distributed: bool, n: int | None) -> list[tuple[str, str, str]]:
    only = {s for s in os.environ.get("DDLCOURSE_EXERCISES", "").split(",") if s}
    where = _where()
    cases = []
    for name, ex in sorted(_build_it().items()):
        if name not in where or (only and name not in only) or ex.distributed != distributed:
            continue
        if distributed and n not in ex.ranks:
            continue
        cases.append((name, *template_of(name, where[name])))
    return cases


def _on_ranks(n: int, cases, tmp_path, mistakes: bool) -> None:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    p = run_ranks(n, "build_it_checks", path, "mistakes" if mistakes else "reference", timeout=600)
    assert "ALL OK" in p.stdout, p.stdout[-6000:]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_distributed_checkers_on_ranks(n, tmp_path):
    """What a learner's check meets: each registered mistake is named by the rehearsal on ``n`` simulated ranks
    (a check stops there, before the real ranks, when the rehearsal finds a mistake: so do these), and the
    reference passes the rehearsal; then, on ``n`` real ranks, the reference passes and the template says
    'not written yet'."""
    cases = _cases(True, n)
    if not cases:
        pytest.skip(f"no build-it exercise runs on {n} ranks")
    failures = []
    for name, _, _ in cases:
        ex = sc._code_exercise(name)
        for fn, hint in [(ex.solution, None), *ex.mistakes]:
            verdicts, _ = sc.rehearse(name, fn, n)
            said = " | ".join(v.message for v in verdicts if not v.ok)
            if hint is None and said:
                failures.append(f"{name}: the rehearsal rejects the reference: {said}")
            elif hint is not None and (not said or hint not in said):
                failures.append(f"{name}: the rehearsal of {getattr(fn, '__name__', fn)!r} says {said!r}, want {hint!r}")
    assert not failures, "\n".join(failures)
    _on_ranks(n, cases, tmp_path, mistakes=False)


def test_serial_checkers(tmp_path):
    cases = _cases(False, None)
    if not cases:
        pytest.skip("no serial build-it exercise")
    _on_ranks(1, cases, tmp_path, mistakes=True)
