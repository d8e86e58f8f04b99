"""Checked comparisons of two training runs must not hold a fixed tolerance over the whole run (issue 29).

Two correct float32 training runs that add in a different order (serial against N ranks, a 2-D mesh against one
process) differ by rounding at the first step, and training (AdamW above all) amplifies that: after a few
hundred steps their loss curves differ by 1e-3 or more at single steps, though neither is wrong. So the course
compares training runs *tightly over the first steps* (a slice ``[:k]`` with a small ``k``) and *statistically
over the rest* (:func:`ddlcourse.integrity.trajectories_agree` does both), never with one fixed tolerance over
the whole run.

The same holds for the parameters at the end of a run (issue 45): after 200 steps at lr 0.2 on 8 ranks, the final
parameters of serial and 8-way float32 runs differ by 7e-3 (SGD with momentum) or 2.6e-2 (Adam), though the SGD
runs agreed to 2e-7 for the first hundred steps. Compare the parameters after the first steps tightly instead
(``experiments.data_parallel.agrees_with_serial``).

The rule, over the code of every checked cell (``# NBVAL_CHECK_OUTPUT``) of every notebook and lab:

* A *run* is an expression that names a loss history or the parameters a run ends with: a subscript with a
  string key that contains ``loss``, ``history``, ``curve`` or ``param`` (``r["losses"]``, ``o["history"]``,
  ``o["params"]``), a variable of such a name (``losses``, ``serial_curve``), or a variable only ever assigned
  a run or a list made from one (``l1 = np.array([h[1] for h in r["history"]])``). Sliced to its *first
  steps* (``[:k]`` with ``k`` a literal of at most :data:`FIRST_STEPS`, or a name that says so: ``exact``,
  ``first``, ``tight``) it is no longer the whole run, nor is a key or a variable whose name says so
  (``o["params_first"]``), nor one step of it (``losses[-1]``).
* A *whole-run comparison* is a call of an element-wise comparison (:data:`ELEMENTWISE`: ``np.allclose``,
  ``integrity.max_difference``, ``dcp.continues_exactly``, ...) or a ``zip(...)`` (``max(abs(a - b) for a, b
  in zip(...))``) with two or more runs among its arguments, or the difference ``a - b`` of two runs
  (``np.abs(o["params"] - ref["params"]).max()``).
* A checked cell fails the rule when one of its expressions holds a whole-run comparison, either directly or
  through a variable it uses that an earlier cell (or the cell itself) assigned from one (followed through a
  few assignments).

``integrity.trajectories_agree`` and ``integrity.compare_runs`` are the right helpers and never count.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))
MARK = "# NBVAL_CHECK_OUTPUT"
RUN_WORDS = re.compile(r"loss|history|curve|param", re.I)
FIRST_WORDS = re.compile(r"exact|first|tight", re.I)
FIRST_STEPS = 20
ELEMENTWISE = {"allclose", "isclose", "assert_allclose", "max_difference", "max_rel_diff", "losses_agree",
               "continues_exactly", "array_equal"}
ALLOWED = {"trajectories_agree", "compare_runs"}
DEPTH = 4          # assignments followed from a checked cell back to the whole-run comparison


def _parse(src: str) -> ast.Module | None:
    """A cell's code without IPython magics and shell lines; None when it is no Python."""
    lines = ["" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _small(node: ast.expr | None) -> bool:
    """A literal number of first steps, or ``min(...)`` of one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return 0 < node.value <= FIRST_STEPS
    return isinstance(node, ast.Call) and _call_name(node) == "min" and any(_small(a) for a in node.args)


def _first_steps(sl: ast.Slice, small_names: frozenset = frozenset()) -> bool:
    """``[:k]`` with a small ``k``: a literal, a name assigned one, or a name that says it is the first steps."""
    up = sl.upper
    if up is None or sl.lower is not None and not (isinstance(sl.lower, ast.Constant) and sl.lower.value == 0):
        return False
    if _small(up) or isinstance(up, ast.Name) and up.id in small_names:
        return True
    return bool(FIRST_WORDS.search(ast.unparse(up)))


def _run_word(name: str) -> bool:
    """A name of a whole run: it says loss, history, curve or param, and not first (``params_first``)."""
    return bool(RUN_WORDS.search(name)) and not FIRST_WORDS.search(name)


def _is_run(node: ast.expr, small_names: frozenset = frozenset(), run_names: frozenset = frozenset()) -> bool:
    """Does ``node`` name a whole loss history or a run's final parameters (not a slice of its first steps)?"""
    if isinstance(node, ast.Subscript):
        if isinstance(node.slice, ast.Slice):
            return not _first_steps(node.slice, small_names) and _is_run(node.value, small_names, run_names)
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return _run_word(key.value)
        if isinstance(key, (ast.Constant, ast.UnaryOp)) and _is_run(node.value, small_names, run_names):
            return False                                   # one step of a run (losses[-1]), not the run
        return _is_run(node.value, small_names, run_names)
    if isinstance(node, ast.Name):
        return _run_word(node.id) or node.id in run_names
    if isinstance(node, ast.Attribute):
        return _run_word(node.attr)
    if isinstance(node, ast.Call) and _call_name(node) in {"asarray", "array", "tensor", "list"} and node.args:
        return _is_run(node.args[0], small_names, run_names)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):        # one value per step of a run
        return any(_is_run(g.iter, small_names, run_names) for g in node.generators)
    return False


def whole_run_comparisons(tree: ast.AST, small_names: frozenset = frozenset(),
                          run_names: frozenset = frozenset()) -> list[str]:
    """The whole-run comparisons written directly in ``tree`` (their source text)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in ALLOWED:
                continue
            if name == "zip" or name in ELEMENTWISE:
                if sum(_is_run(a, small_names, run_names) for a in node.args) >= 2:
                    found.append(ast.unparse(node))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            if _is_run(node.left, small_names, run_names) and _is_run(node.right, small_names, run_names):
                found.append(ast.unparse(node))
    return found


def _allowed_subtrees(tree: ast.AST) -> set[int]:
    return {id(n) for call in ast.walk(tree) if isinstance(call, ast.Call) and _call_name(call) in ALLOWED
            for n in ast.walk(call)}


def _target_names(t: ast.expr) -> list[str]:
    """The variables an assignment to ``t`` changes: ``a``, ``a, b``, and ``a`` of ``a[k] = ...``, not ``k``."""
    if isinstance(t, (ast.Tuple, ast.List)):
        return [n for e in t.elts for n in _target_names(e)]
    while isinstance(t, (ast.Subscript, ast.Attribute, ast.Starred)):
        t = t.value
    return [t.id] if isinstance(t, ast.Name) else []


def notebook_violations(cells: list[str]) -> list[str]:
    """``cells``: the code cells of a notebook, in order. The checked cells' whole-run comparisons."""
    trees = [_parse(src) for src in cells]
    assigned: dict[str, list[tuple[int, ast.expr]]] = {}      # name -> (cell index, value) of each assignment
    for i, tree in enumerate(trees):
        for node in ast.walk(tree or ast.Module(body=[], type_ignores=[])):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value else [])
            for t in targets:
                for name in _target_names(t):
                    assigned.setdefault(name, []).append((i, node.value))
    # names only ever assigned a small number of steps (k = min(10, S.steps)): [:k] is the first steps
    small = frozenset(k for k, vals in assigned.items() if all(_small(v) for _, v in vals))
    # names only ever assigned a run (l1 = np.array([h[1] for h in r["history"]])) are runs too
    runs = frozenset(k for k, vals in assigned.items() if all(_is_run(v, small) for _, v in vals))

    def through(node: ast.AST, upto: int, depth: int, seen: set) -> list[str]:
        hits = whole_run_comparisons(node, small, runs)
        if depth == 0:
            return hits
        skip = _allowed_subtrees(node)
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in skip and n.id not in seen:
                for i, value in assigned.get(n.id, []):
                    if i <= upto:
                        hits += through(value, i, depth - 1, seen | {n.id})
        return hits

    out = []
    for i, (src, tree) in enumerate(zip(cells, trees)):
        if tree is not None and MARK in src:
            out += [f"checked code cell {i} uses {h}" for h in dict.fromkeys(through(tree, i, DEPTH, set()))]
    return out


def _code_cells(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


# Exceptions, each with its reason: a whole-run comparison in float64 whose claim a test proves at the cluster
# profile's ranks, steps and learning rates. The rule cannot tell float64 from float32; a strict xfail fails once
# the rule passes the notebook, so the line is removed then.
KNOWN: dict[str, str] = {
    "09_parameter_server.ipynb": "float64 final parameters within 1e-12 (staleness 0 against serial, local SGD with "
                                 "H = 1 against data parallelism): they hold at cluster scale "
                                 "(test_cluster_scale_claims), but the rule cannot tell float64 from float32",
}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.xfail(reason=KNOWN[p.name], strict=True))
                                  if p.name in KNOWN else p for p in NOTEBOOKS], ids=lambda p: p.name)
def test_checked_training_comparisons_are_tight_only_over_the_first_steps(path):
    bad = notebook_violations(_code_cells(path))
    assert not bad, (f"{path.name}: a checked cell compares whole training runs with a fixed tolerance; compare "
                     "the first steps tightly and the rest statistically (integrity.trajectories_agree):\n  "
                     + "\n  ".join(bad))


# --------------------------------------------------------------------------- the rule itself
@pytest.mark.parametrize("cells", [
    ['gap = max(abs(a - b) for a, b in zip(serial["losses"], run["losses"]))', f'{MARK}\nprint(gap < 1e-3)'],
    [f'{MARK}\nprint(np.allclose(r1["history"], r2["history"], atol=1e-4))'],
    ['serial = f()', f'{MARK}\nprint(all(dcp.continues_exactly(o["losses"], serial["losses"]) for o in runs))'],
    ['losses = run()["losses"]', 'ref_losses = ref()["losses"]', 'd = integrity.max_difference(losses, ref_losses)',
     'ok = d < 1e-5', f'{MARK}\nprint("same:", ok)'],
    ['gap = max(abs(a - b) for a, b in zip(x["losses"][5:], y["losses"][5:]))', f'{MARK}\nprint(gap < 1e-4)'],
    # notebook 05 before issue 45: the final parameters after the whole run, against serial's, within 1e-5
    ['worst = {}', 'out = run()', 'worst[k] = max(float(np.abs(o["params"] - ref["params"]).max()) for o in out)',
     f'{MARK}\nprint("end at the serial parameters:", all(v < 1e-5 for v in worst.values()))'],
    # lab 3 before issue 45: whole loss curves, through variables whose names do not say so
    ['l1 = np.array([h[1] for h in runs[1]["history"]])', 'l2 = np.array([h[1] for h in runs[2]["history"]])',
     f'{MARK}\nprint(bool(np.allclose(l1, l2, rtol=1e-5, atol=1e-6)))'],
])
def test_the_rule_catches_whole_run_tolerances(cells):
    assert notebook_violations(cells)


@pytest.mark.parametrize("cells", [
    [f'{MARK}\nprint(integrity.trajectories_agree(serial["losses"], run["losses"], atol=1e-5, exact_steps=5))'],
    ['first = 5', f'{MARK}\nprint(max(abs(a - b) for a, b in zip(s["losses"][:first], r["losses"][:first])) < 1e-5)'],
    [f'{MARK}\nprint(np.allclose(s["losses"][:10], r["losses"][:10], atol=1e-5))'],
    ['gap = max(abs(a - b) for a, b in zip(serial["losses"], run["losses"]))', 'print(gap)'],   # not checked
    [f'{MARK}\nprint(all(max(d["loss_diff"], d["grad_diff"]) < 1e-5 for d in cmp))'],            # one step
    [f'{MARK}\nprint(max(float(np.abs(o["params_first"] - ref["params_first"]).max()) for o in out) < 1e-5)'],
])
def test_the_rule_accepts_first_steps_and_statistics(cells):
    assert not notebook_violations(cells)
