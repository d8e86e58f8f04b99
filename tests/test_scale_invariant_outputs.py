"""A checked cell's stored output holds at every scale: it prints no size of the scale profile that changes with
the scale.

nbval holds a checked cell (``# NBVAL_CHECK_OUTPUT``) to its output stored at smoke scale, and env/gpu_smoke.sh's
``nbval_cluster`` runs every notebook at cluster scale against the same outputs; tests/sanitize.cfg normalises
PIDs, durations, ports and cluster ids, not sizes. A cell that prints ``S.n_ranks`` passes at smoke scale and
fails at cluster scale, whatever the GPUs do. This test finds every field of the notebook's scale profile that a
checked cell prints as it is (a ``print`` argument, or a value of an f-string that ``print`` gets), and fails
when the field's value differs between the scales.
"""
import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

from ddlcourse import config

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))
PROFILE = re.compile(r"^(\w+)\s*=\s*config\.sizes\(\s*[\"'](\w+)[\"']", re.M)   # S = config.sizes("profiling")


def _source(cell) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def printed_fields(source: str) -> set[tuple[str, str]]:
    """``(name, field)`` of every ``name.field`` that ``source`` prints as it is."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    out = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"):
            continue
        for arg in node.args:
            values = ([v.value for v in arg.values if isinstance(v, ast.FormattedValue)]
                      if isinstance(arg, ast.JoinedStr) else [arg])
            out |= {(v.value.id, v.attr) for v in values
                    if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name)}
    return out


def scale_dependent_prints(path: Path) -> list[str]:
    """What the checked cells of ``path`` print that changes with the scale (one line each)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code = [_source(c) for c in cells if c["cell_type"] == "code"]
    profiles = dict(PROFILE.findall("\n".join(code)))            # name -> section
    found = []
    for i, cell in enumerate(cells):
        src = _source(cell)
        if cell["cell_type"] != "code" or "# NBVAL_CHECK_OUTPUT" not in src:
            continue
        for name, field in sorted(printed_fields(src)):
            if name not in profiles:
                continue
            values = {scale: getattr(config.sizes(profiles[name], scale), field, None) for scale in config.SCALES}
            if len(set(map(repr, values.values()))) > 1:
                found.append(f"{path.name} cell {i} ({cell.get('id')}): prints {name}.{field}, which is "
                             + ", ".join(f"{v} at {s}" for s, v in values.items()))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_checked_cells_print_no_size_that_changes_with_the_scale(path):
    found = scale_dependent_prints(path)
    assert not found, "state the result without the size, or leave it out of the checked cell:\n" + "\n".join(found)


def test_the_rule_finds_the_rank_counts_of_notebooks_24_and_26(tmp_path):
    """The two cells that kept env/gpu_smoke.sh's nbval_cluster from passing (issue 45), and what passes."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        'S = config.sizes("profiling")\nN = config.sizes("native_sharding_checkpoints")',
        'L = config.sizes("loss_integrity")',
        '# NBVAL_CHECK_OUTPUT\nprint("allreduce time on 1 rank (serial step): absent; on", S.n_ranks, "ranks (DDP): '
        'non-zero:", one == 0 and many > 0)',
        '# NBVAL_CHECK_OUTPUT\nprint(f"the resharded DCP load gives {N.n_load} ranks exactly the parameters saved on '
        '{N.n_save}:", ok)',
        '# NBVAL_CHECK_OUTPUT\nprint(f"trajectories agree within {L.tol:g}:", worst < L.tol, S.n_ranks > 1)',
        'print("not checked:", S.n_ranks)',
    )]
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    found = scale_dependent_prints(path)
    assert [f.split(": prints ")[1].split(",")[0] for f in found] == ["S.n_ranks", "N.n_load", "N.n_save"], found
    assert "2 at smoke, 2 at laptop, 8 at cluster" in found[0]
