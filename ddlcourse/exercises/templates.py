"""What the learner starts from: the template of each coding exercise, as its notebook's build-it cell has it, and
the same template as a file of its own under ``exercises/<topic>/<name>.py`` (the longer build-it exercises), for
a learner who prefers an editor and a terminal::

    python -m ddlcourse check-exercise ring_allreduce exercises/collectives/ring_allreduce.py

The files are made from the notebooks (:func:`write_starts`; ``python -m ddlcourse check-exercise --write-starts``),
so the two never drift apart: a test makes them again and compares.
"""
from __future__ import annotations

import ast
import json
import re
import textwrap
from pathlib import Path

from ddlcourse import selfcheck
from ddlcourse.training.results import repo_root

START_DIR = "exercises"                 # in the checkout
LONG = 10                               # logical lines of reference from which an exercise gets a file
BUILDING_BLOCKS = {"np", "torch", "tdist", "nn", "F", "MPI"}   # kept in a file when its notebook imports them
_CALL = re.compile(r"""(?:check_code|use_checked)\(\s*["']([A-Za-z0-9_]+)["']\s*,\s*([A-Za-z_][A-Za-z0-9_]*)""")


def notebooks(root: Path | None = None) -> list[Path]:
    """The concept notebooks and the labs, in the course's order."""
    root = root or _root()
    return sorted((root / "notebooks").glob("*.ipynb")) + sorted((root / "labs").glob("*.ipynb"))


def _root() -> Path:
    root = repo_root()
    if root is None:
        raise FileNotFoundError("the course's notebooks are not here: this needs the course checkout")
    return root


def _code_cells(nb: Path) -> list[str]:
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c["cell_type"] == "code"]


def notebook_of(name: str, root: Path | None = None) -> Path:
    """The notebook (or lab) that asks for coding exercise ``name``."""
    for nb in notebooks(root):
        if any(m.group(1) == name for src in _code_cells(nb) for m in _CALL.finditer(src)):
            return nb
    raise KeyError(f"no notebook asks for the coding exercise {name!r}")


def template(name: str, root: Path | None = None) -> tuple[str, list[str], str]:
    """``(learner, imports, definition)``: the name of the function or class the learner writes for ``name``, the
    import statements of the notebook's cells up to the one that checks it, and the template's definition."""
    nb = notebook_of(name, root)
    cells = _code_cells(nb)
    learner, at = None, None
    for i, src in enumerate(cells):
        m = next((m for m in _CALL.finditer(src) if m.group(1) == name), None)
        if m:
            learner, at = m.group(2), i
            break
    imports, definition = [], None
    for src in cells[:at + 1]:
        try:
            tree = ast.parse(re.sub(r"^\s*[%!].*$", "", src, flags=re.M))   # magics are not Python
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.append(ast.get_source_segment(src, node))
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == learner:
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                definition = "\n".join(src.splitlines()[first - 1:node.end_lineno])   # whole lines: comments too
    if definition is None:
        raise KeyError(f"{nb.name}: {learner} (the template of {name!r}) is not defined in a code cell")
    return learner, imports, definition


def script(name: str, root: Path | None = None) -> tuple[str, str]:
    """``(learner, source)``: a script that defines the template of ``name`` with the notebook's imports."""
    learner, imports, definition = template(name, root)
    return learner, "\n".join(imports + [definition])


def topic(name: str) -> str:
    """The topic of coding exercise ``name``: the name of its checker module (``collectives`` for the ring)."""
    return selfcheck._code_exercise(name).checker.__module__.rsplit(".", 1)[1]


def start_path(name: str, root: Path | None = None) -> Path:
    return (root or _root()) / START_DIR / topic(name) / f"{name}.py"


def long_exercises() -> list[str]:
    """The coding exercises that get a file of their own: those whose reference has ``LONG`` logical lines or more."""
    selfcheck._load_all()
    return sorted(n for n, ex in selfcheck.CODE_EXERCISES.items()
                  if not n.startswith("_") and ex.solution is not None and selfcheck.logical_lines(ex.solution) >= LONG)


def start_text(name: str, root: Path | None = None) -> str:
    """The file a learner starts ``name`` from: how to check it, then the notebook's template."""
    learner, imports, definition = template(name, root)
    nb = notebook_of(name, root)
    rel = start_path(name, root).relative_to(root or _root())
    used = {n.id for n in ast.walk(ast.parse(definition)) if isinstance(n, ast.Name)}
    imports = [i for i in dict.fromkeys(imports) if _binds(i) & (used | BUILDING_BLOCKS)]   # once each, in order
    ex = selfcheck._code_exercise(name)
    where = (f"It runs on {ex.ranks[0]} ranks that the command starts (--ranks N for another count); each rank "
             "loads the whole file," if ex.distributed else "The checker loads the whole file,")
    head = [f'"""Build it: {learner}, the coding exercise {name!r} of {nb.parent.name}/{nb.name}.',
            "",
            "The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in",
            "the course folder:",
            "",
            f"    python -m ddlcourse check-exercise {name} {rel}",
            "",
            *textwrap.wrap(f"{where} so helper functions you write here come with it.", 115),
            '"""']
    return "\n".join(head + imports + ["", "", definition]) + "\n"


def _binds(statement: str) -> set[str]:
    """The names an import statement binds."""
    node = ast.parse(statement).body[0]
    return {(a.asname or a.name).split(".")[0] for a in node.names}


def write_starts(root: Path | None = None) -> list[Path]:
    """(Re)write ``exercises/<topic>/<name>.py`` for every long exercise; returns the files written."""
    out = []
    for name in long_exercises():
        path = start_path(name, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(start_text(name, root))
        out.append(path)
    return out
