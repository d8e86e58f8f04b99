"""What the learner starts from, as a file: ``exercises/<topic>/<name>.py`` holds the notebook's template of every
longer build-it exercise (made from the notebooks, so the two never drift apart), and ``python -m ddlcourse
check-exercise NAME FILE`` checks a file with the same checker and hints as the notebook's ``check_code``."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddlcourse import selfcheck as sc
from ddlcourse.exercises import templates

from helpers import solution_lines, text_shows

ROOT = Path(__file__).resolve().parent.parent


def test_every_long_exercise_has_its_file_made_from_its_notebook():
    names = templates.long_exercises()
    assert len(names) >= 30, names
    stored = {p.relative_to(ROOT) for p in (ROOT / templates.START_DIR).rglob("*.py")}
    wanted = {templates.start_path(n).relative_to(ROOT) for n in names}
    assert stored == wanted, f"missing: {sorted(wanted - stored)}; extra: {sorted(stored - wanted)}"
    stale = [n for n in names if templates.start_path(n).read_text() != templates.start_text(n)]
    assert not stale, (f"files that differ from their notebook's template: {stale}; make them again with "
                       "python -m ddlcourse check-exercise --write-starts")


def test_a_start_file_is_the_template_and_no_solution():
    for name in templates.long_exercises():
        text = templates.start_path(name).read_text()
        learner = templates.template(name)[0]
        assert "raise NotImplementedError" in text and f" {learner}" in text, name
        ns = {}
        exec(compile(text, str(templates.start_path(name)), "exec"), ns)        # it runs as it is
        assert text_shows(text, solution_lines(sc._code_exercise(name).solution)) is None, name


def _solved(name: str, tmp_path: Path) -> Path:
    """A learner's file that holds the reference, under the template's name."""
    learner, imports, _ = templates.template(name)
    src = sc.solution(name)
    solution = sc._code_exercise(name).solution.__name__
    f = tmp_path / f"{name}.py"
    f.write_text("\n".join([*imports, "", src, f"{learner} = {solution}", ""]))
    return f


def _check(*argv, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddlcourse", "check-exercise", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.mpi
def test_check_exercise_from_a_terminal_on_the_ranks(tmp_path):
    name = "ring_allreduce"
    p = _check(name, str(_solved(name, tmp_path)))
    assert p.returncode == 0 and "[ring_allreduce] correct on all 2 ranks" in p.stdout, p.stdout + p.stderr
    p = _check(name)                                             # the learner's own file: still the template
    assert p.returncode == 1 and "not written yet" in p.stdout, p.stdout + p.stderr
    p = _check(name, str(_solved(name, tmp_path)), "--ranks", "3")
    assert p.returncode == 0 and "correct on all 3 ranks" in p.stdout, p.stdout + p.stderr


def test_check_exercise_here_and_its_mistakes(tmp_path, capsys):
    from ddlcourse.exercises import terminal
    name = next(n for n in templates.long_exercises() if not sc._code_exercise(n).distributed)
    assert terminal.main([name, str(_solved(name, tmp_path))]) == 0
    assert f"[{name}] correct" in capsys.readouterr().out
    wrong = tmp_path / "other.py"
    wrong.write_text("def something_else():\n    pass\n")
    with pytest.raises(ValueError, match=f"defines no {templates.template(name)[0]!r}"):
        terminal.main([name, str(wrong)])
    with pytest.raises(FileNotFoundError, match="no file"):
        terminal.main([name, str(tmp_path / "missing.py")])
    assert terminal.main(["--list"]) == 0
    assert name in capsys.readouterr().out
