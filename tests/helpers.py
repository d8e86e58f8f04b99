"""Helpers that several test modules share (tests/ is on sys.path under pytest: ``from helpers import ...``)."""
from __future__ import annotations

import ast
import inspect
import json
import re
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
