"""The course's order (issue 27): one path through the notebooks, in parts, that builds.

* Notebooks are numbered 00, 01, 02, ... without gaps and without letter suffixes.
* Each belongs to one of five parts (PARTS), and its header says which, what it assumes, what it teaches and how
  long it runs at laptop scale.
* Every "Assumes" line names earlier notebooks only: a notebook that needs a later one is out of order.
* The README lists every notebook, in order, under its part.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import NOTEBOOK_REF, notebook_numbers

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LABS = sorted((ROOT / "labs").glob("*.ipynb"))

# (part, name, first notebook, last notebook)
PARTS = [
    (1, "Foundations", 0, 2),
    (2, "Data parallelism", 3, 13),
    (3, "Beyond one device's memory", 14, 19),
    (4, "Transformer-era parallelism", 20, 22),
    (5, "Running at scale", 23, 30),
]
HEADER = re.compile(r"^\*\*(?:Part (\d) · ([^*]+)|Lab (\d) of 4)\*\* · about (\d+) minutes? at laptop scale", re.M)
OBJECTIVES = ("You will learn", "You will:", "Learning objectives")


def part_of(number: int) -> tuple[int, str]:
    for p, name, first, last in PARTS:
        if first <= number <= last:
            return p, name
    raise KeyError(f"notebook {number:02d} is in no part")


def header(path: Path) -> str:
    return "".join(json.loads(path.read_text())["cells"][0]["source"])


def assumed(text: str) -> list[str]:
    """The notebook numbers the "**Assumes:**" paragraph of a header names."""
    m = re.search(r"\*\*Assumes:?\*\*:?(.*?)(?:\n\s*\n|\Z)", text, re.S)
    if not m:
        return []
    return [n for r in NOTEBOOK_REF.finditer(m.group(1)) for n in notebook_numbers(r.group(1), r.group(2) or "")]


def later_assumptions(path: Path, text: str) -> list[str]:
    own = int(path.name[:2])
    return [n for n in assumed(text) if not n.isdigit() or int(n) >= own]


def test_notebooks_are_numbered_contiguously_without_letters():
    numbers = [p.name.split("_")[0] for p in NOTEBOOKS]
    assert all(re.fullmatch(r"\d\d", n) for n in numbers), f"letter suffixes or odd names: {numbers}"
    assert [int(n) for n in numbers] == list(range(len(numbers))), f"gaps or repeats: {numbers}"


def test_the_parts_cover_every_notebook_once():
    covered = [k for _, _, first, last in PARTS for k in range(first, last + 1)]
    assert covered == list(range(len(NOTEBOOKS)))


@pytest.mark.parametrize("path", NOTEBOOKS + LABS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_header_names_part_objectives_assumptions_and_time(path):
    text = header(path)
    assert text.startswith(f"# {path.name[:2]} · ") or path.parent.name == "labs", "the title starts with 'NN · '"
    m = HEADER.search(text)
    assert m, "no '**Part P · name** · about M minutes at laptop scale' line (labs: '**Lab L of 4** · ...')"
    if path.parent.name == "notebooks":
        assert (int(m.group(1)), m.group(2)) == part_of(int(path.name[:2])), f"wrong part: {m.group(0)}"
        assert any(o in text for o in OBJECTIVES), "no objectives ('You will learn ...')"
        assert "**Assumes:**" in text, "no '**Assumes:**' line"
    else:
        assert int(m.group(3)) == int(path.name[:2])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_assumes_names_only_earlier_notebooks(path):
    later = later_assumptions(path, header(path))
    assert not later, f"{path.name} assumes notebook(s) {later}, which come after it: reorder, or teach it here"


def test_the_order_rule_catches_a_later_notebook():
    """The old 12b assumed 12c's transformer; as 20 and 21 that is a later notebook."""
    text = ("# 20 · Tensor parallelism\n\n**Assumes:** notebook 04 (collectives), notebook 18 (tensor parallelism), "
            "and the\ntransformer of notebook 21 (context parallelism).\n\nNext paragraph: notebook 29.")
    assert later_assumptions(Path("20_x.ipynb"), text) == ["21"]
    assert later_assumptions(Path("22_x.ipynb"), text) == []


def test_the_readme_lists_every_notebook_in_order_under_its_part():
    readme = (ROOT / "README.md").read_text()
    positions = []
    for path in NOTEBOOKS:
        stem = path.stem
        row = f"| `notebooks/{stem}` |"
        assert row in readme, f"README's table does not list {stem}"
        positions.append(readme.index(row))
    assert positions == sorted(positions), "README lists the notebooks out of order"
    for p, name, first, _ in PARTS:
        heading = f"Part {p} · {name}"
        assert heading in readme, f"README has no '{heading}'"
        assert readme.index(heading) < positions[first], f"'{heading}' is not above notebook {first:02d}"
