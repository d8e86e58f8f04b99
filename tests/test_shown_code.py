"""Package code that a notebook shows is the package's real source, printed by ``ddlcourse.show``; never a copy.

A ```python block in a notebook's markdown that repeats a package function drifts from it the first time the
package changes, and nothing notices. The course's rule: where a notebook shows package code, a code cell prints it
with ``ddlcourse.show(obj, start, stop)``. Three checks, each with a planted example that it must catch:

1. **No copies.** No markdown cell of notebooks/ or labs/ holds three consecutive lines (blank lines left out,
   trailing comments and whitespace stripped, as in ``helpers.normal``) that all appear in one function of
   ``ddlcourse/`` (docstrings and comment lines left out). Any fenced block counts, ```text ones too.
2. **Usage examples name real things.** What stays a ```python block (how to call the API) parses, and every
   name it takes from the package exists: the notebook's own imports above the cell and the block's imports are
   resolved, so ``layout.Layout``, ``from ddlcourse.parallel.data_parallel import wrap`` and ``layout.PRESETS["7B"]``
   must exist, a call to a package callable must bind to its signature (``Layout(dp=..., zero=...)``), and a
   name spelled like a ddlcourse module (``dist.rank()``) must be imported. Pseudo-code is marked ```text and
   skipped.
3. **Every ``ddlcourse.show(...)`` resolves.** Its object exists where the notebook's imports say, its start and
   stop are literal strings, and ``ddlcourse.show`` finds both lines in the object's source (called here, with its
   print captured). A show cell's output is not checked by nbval (no ``# NBVAL_CHECK_OUTPUT``).
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import json
import pkgutil
import re
import textwrap
from functools import lru_cache
from pathlib import Path

import pytest

import ddlcourse
from helpers import normal

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))
PACKAGE = ROOT / "ddlcourse"
RUN = 3                     # this many consecutive lines of one function make a copy
FENCE = re.compile(r"^[ \t]*```")
PYTHON_BLOCK = re.compile(r"^([ \t]*)```python[ \t]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
MAGIC = re.compile(r"^[ \t]*[%!].*$", re.MULTILINE)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _ids(paths):
    return [f"{p.parent.name}/{p.stem}" for p in paths]


# ----------------------------------------------------------------------------- 1. no copies of package functions
def _docstring_lines(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            out |= set(range(body[0].lineno, body[0].end_lineno + 1))
    return out


@lru_cache(maxsize=None)
def package_lines() -> dict[str, frozenset[str]]:
    """normalized line -> the functions of ddlcourse/ ("file:line name") whose code holds it."""
    where: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        lines, doc = text.splitlines(), _docstring_lines(tree)
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            key = f"{path.relative_to(ROOT).as_posix()}:{fn.lineno} {fn.name}"
            for i in range(fn.lineno, fn.end_lineno + 1):
                line = normal(lines[i - 1])
                if i not in doc and line and not line.startswith("#"):
                    where.setdefault(line, set()).add(key)
    return {line: frozenset(keys) for line, keys in where.items()}


def copies(cells: list[dict], k: int = RUN) -> list[str]:
    """Each run of ``k`` consecutive non-blank lines of a markdown cell that all appear in one package function."""
    known = package_lines()
    found = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        lines = [normal(l) for l in _src(cell).splitlines() if not FENCE.match(l)]
        lines = [l for l in lines if l]
        for j in range(len(lines) - k + 1):
            run = lines[j:j + k]
            common = frozenset.intersection(*(known.get(l, frozenset()) for l in run))
            if common:
                found.append(f"cell {i}: {' | '.join(run)}  (in {', '.join(sorted(common))})")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_no_markdown_cell_copies_package_code(path):
    found = copies(_cells(path))
    assert not found, (f"{path.name} shows package code as a copy in markdown; print it with "
                       "ddlcourse.show(obj, start, stop) in a code cell instead:\n" + "\n".join(found))


def test_the_copy_rule_catches_a_planted_copy():
    from ddlcourse import elastic
    with contextlib.redirect_stdout(io.StringIO()):
        excerpt = ddlcourse.show(elastic.train_loop, "for step in range(start, steps):", "opt.zero_grad(")
    lines = excerpt.splitlines()
    assert len(lines) >= RUN
    # the copy as a notebook would paste it: other comments, other indentation, a blank line in between
    pasted = "\n\n".join(f"    {line.strip()}   # NEW: a comment of the notebook's" for line in lines)
    planted = [{"cell_type": "markdown", "source": "The loop:\n```python\n" + pasted + "\n```\nand prose."}]
    found = copies(planted)
    assert found and "ddlcourse/elastic.py" in found[0] and "train_loop" in found[0], found
    planted[0]["source"] = planted[0]["source"].replace("```python", "```text")
    assert copies(planted), "a copy marked ```text is still a copy"
    # two lines are not a copy, and prose or pseudo-code is not one either
    assert not copies([{"cell_type": "markdown", "source": "```python\n" + "\n".join(lines[:RUN - 1]) + "\n```"}])
    assert not copies([{"cell_type": "markdown", "source": "```text\ng  ->  reduce_scatter_seq\nf  ->  gather_seq\n"
                                                           "x -> y\n```"}])
    assert not copies([{"cell_type": "code", "source": excerpt}]), "code cells are not markdown"


# ----------------------------------------------------------------------------- 2. usage examples name real things
@lru_cache(maxsize=None)
def module_names() -> frozenset[str]:
    """The last part of every ddlcourse module's name (``dist``, ``layout``, ``spatial``, ...)."""
    names = {m.name.rsplit(".", 1)[-1] for m in pkgutil.walk_packages(ddlcourse.__path__, "ddlcourse.")}
    return frozenset(names | {"ddlcourse"})


def _ours(name: str | None) -> bool:
    return name == "ddlcourse" or (name or "").startswith("ddlcourse.")


def bind_imports(tree: ast.AST, env: dict, problems: list[str], where: str) -> None:
    """Apply the top-level import statements of ``tree`` to ``env`` (name -> object): ddlcourse's are imported,
    any other import removes the names it binds (they are not the package's)."""
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound = a.asname or a.name.split(".")[0]
                if not _ours(a.name):
                    env.pop(bound, None)
                    continue
                try:
                    mod = importlib.import_module(a.name)
                except ImportError as e:
                    problems.append(f"{where}: import {a.name}: {e}")
                    continue
                env[bound] = mod if a.asname else importlib.import_module(a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                bound = a.asname or a.name
                if node.level or not _ours(node.module):
                    env.pop(bound, None)
                    continue
                try:
                    mod = importlib.import_module(node.module)
                except ImportError as e:
                    problems.append(f"{where}: from {node.module} import ...: {e}")
                    continue
                if hasattr(mod, a.name):
                    env[bound] = getattr(mod, a.name)
                    continue
                try:
                    env[bound] = importlib.import_module(f"{node.module}.{a.name}")
                except ImportError:
                    problems.append(f"{where}: from {node.module} import {a.name}: {node.module} has no {a.name}")


def _chain(node: ast.AST) -> list[str] | None:
    """``layout.Layout`` -> ["layout", "Layout"]; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id] + parts[::-1] if isinstance(node, ast.Name) else None


_MISSING = object()


def resolve(node: ast.AST, env: dict, problems: list[str], where: str):
    """The package object ``node`` (a name or an attribute chain) names, or _MISSING where it is not the package's."""
    parts = _chain(node)
    if not parts or parts[0] not in env:
        return _MISSING
    obj = env[parts[0]]
    for i, part in enumerate(parts[1:], 1):
        if not hasattr(obj, part):
            problems.append(f"{where}: {'.'.join(parts)}: {'.'.join(parts[:i])} has no attribute {part!r}")
            return _MISSING
        obj = getattr(obj, part)
    return obj


def _from_package(obj) -> bool:
    return inspect.ismodule(obj) and _ours(obj.__name__) or _ours(getattr(obj, "__module__", None))


def block_problems(source: str, env: dict, where: str) -> list[str]:
    """What is wrong with one ```python usage block, given the names the notebook has imported above it."""
    problems: list[str] = []
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [f"{where}: does not parse ({e.msg}, line {e.lineno}); mark pseudo-code ```text"]
    env = dict(env)
    bind_imports(tree, env, problems, where)
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for name in assigned:
        env.pop(name, None)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}   # chains are checked whole
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts = _chain(node)
            if parts and parts[0] not in env and parts[0] not in assigned and parts[0] in module_names():
                problems.append(f"{where}: {'.'.join(parts)}: {parts[0]!r} is a ddlcourse module that the notebook "
                                "has not imported")
            else:
                resolve(node, env, problems, where)
        if isinstance(node, ast.Call):
            fn = resolve(node.func, env, [], where)
            if fn is _MISSING or not callable(fn) or not _from_package(fn):
                continue
            if any(isinstance(a, ast.Starred) for a in node.args) or any(kw.arg is None for kw in node.keywords):
                continue
            try:
                sig = inspect.signature(fn)
            except (TypeError, ValueError):
                continue
            try:
                sig.bind(*node.args, **{kw.arg: kw.value for kw in node.keywords})
            except TypeError as e:
                problems.append(f"{where}: {ast.unparse(node.func)}(...): {e}")
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            table = resolve(node.value, env, [], where)
            if isinstance(table, dict) and node.slice.value not in table:
                problems.append(f"{where}: {ast.unparse(node)}: no key {node.slice.value!r} "
                                f"(there are {sorted(map(str, table))})")
    return problems


def _code_tree(source: str) -> ast.Module | None:
    try:
        return ast.parse(MAGIC.sub("", source))
    except SyntaxError:
        return None


def notebook_block_problems(cells: list[dict], name: str) -> list[str]:
    """Every ```python block of the markdown cells, checked against the imports of the code cells above it."""
    env: dict = {}
    problems: list[str] = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            tree = _code_tree(_src(cell))
            if tree is not None:
                bind_imports(tree, env, [], f"{name} cell {i}")
        elif cell["cell_type"] == "markdown":
            for n, m in enumerate(PYTHON_BLOCK.finditer(_src(cell)), 1):
                problems += block_problems(textwrap.dedent(m.group(2)), env, f"{name} cell {i}, block {n}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_python_blocks_in_markdown_name_real_things(path):
    problems = notebook_block_problems(_cells(path), path.name)
    assert not problems, "\n".join(problems)


def test_the_usage_check_catches_misspelled_names():
    imports = {"cell_type": "code", "source": "import ddlcourse\nfrom ddlcourse import config, layout"}

    def check(block: str) -> list[str]:
        return notebook_block_problems([imports, {"cell_type": "markdown", "source": f"```python\n{block}\n```"}],
                                       "planted")

    good = ('m = layout.PRESETS["7B"]\nlay = layout.Layout(dp=64, tp=8, zero=1, sp=True)\n'
            "layout.memory_per_rank(m, lay, layout.MIXED)")
    assert check(good) == []
    assert any("'Layuot'" in p for p in check(good.replace("layout.Layout(", "layout.Layuot("))), "an attribute"
    assert any("'dpp'" in p for p in check(good.replace("dp=64", "dpp=64"))), "a keyword argument"
    assert any("'7b'" in p for p in check(good.replace('"7B"', '"7b"'))), "a key of a package dict"
    assert any("positional" in p for p in check("layout.memory_per_rank(1, 2, 3, 4)")), "too many arguments"
    assert any("memory_per_rnak" in p for p in check("from ddlcourse.layout import memory_per_rnak")), "an import"
    assert any("'dist'" in p for p in check("dist.rank()")), "a package module used without its import"
    assert check("from ddlcourse import dist\ndist.rank()") == []
    assert any("does not parse" in p for p in check("g  ->  reduce_scatter_seq")), "pseudo-code marked python"
    assert check("x = make_inputs(k)\nlview.apply_async(f, x)") == [], "placeholders are not the package's"
    md = {"cell_type": "markdown", "source": "```python\nlayout.Layuot()\n```"}
    assert notebook_block_problems([md, imports], "planted"), "the imports below the block do not count"


# ----------------------------------------------------------------------------- 3. every show call resolves
def _literal(node: ast.AST | None, what: str, problems: list[str], where: str):
    if node is None or isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, str)):
        return None if node is None else node.value
    problems.append(f"{where}: the {what} of ddlcourse.show(...) must be a literal string")
    return _MISSING


def show_calls(cells: list[dict], name: str) -> tuple[list[tuple], list[str]]:
    """``(where, obj, start, stop)`` of every ``ddlcourse.show(...)`` call in the code cells, and the problems."""
    env: dict = {}
    calls, problems = [], []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        where = f"{name} cell {i}"
        source = _src(cell)
        tree = _code_tree(source)
        if tree is None:
            if "show(" in source:
                problems.append(f"{where}: does not parse, so its show calls cannot be checked")
            continue
        bind_imports(tree, env, problems, where)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or resolve(node.func, env, [], where) is not ddlcourse.show:
                continue
            if "# NBVAL_CHECK_OUTPUT" in source:
                problems.append(f"{where}: a show cell prints source code: no # NBVAL_CHECK_OUTPUT on it")
            args = list(node.args) + [None] * 3
            kw = {k.arg: k.value for k in node.keywords}
            target, start, stop = kw.get("obj", args[0]), kw.get("start", args[1]), kw.get("stop", args[2])
            if target is None:
                problems.append(f"{where}: ddlcourse.show() without an object")
                continue
            obj = resolve(target, env, problems, where)
            if obj is _MISSING:
                problems.append(f"{where}: {ast.unparse(target)} is not an object of the package that the notebook "
                                "imported")
                continue
            start = _literal(start, "start", problems, where)
            stop = _literal(stop, "stop", problems, where)
            if start is not _MISSING and stop is not _MISSING:
                calls.append((f"{where}: ddlcourse.show({ast.unparse(target)}, {start!r}, {stop!r})", obj, start, stop))
    return calls, problems


def show_problems(cells: list[dict], name: str) -> list[str]:
    calls, problems = show_calls(cells, name)
    for where, obj, start, stop in calls:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                body = ddlcourse.show(obj, start, stop)
        except (ValueError, TypeError, OSError) as e:
            problems.append(f"{where}: {e}")
            continue
        if not body.strip():
            problems.append(f"{where}: prints nothing")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_every_show_call_resolves(path):
    problems = show_problems(_cells(path), path.name)
    assert not problems, "\n".join(problems)


def test_the_notebooks_show_package_code():
    """The check above runs on something: the notebooks that print package code do it with show."""
    calls = [c for p in NOTEBOOKS for c in show_calls(_cells(p), p.name)[0]]
    assert len(calls) >= 10, calls


def test_the_show_check_catches_a_line_that_is_gone():
    def cells(code: str) -> list[dict]:
        return [{"cell_type": "code", "source": "import ddlcourse\nfrom ddlcourse import elastic"},
                {"cell_type": "markdown", "source": "The loop:"}, {"cell_type": "code", "source": code}]

    good = 'ddlcourse.show(elastic.train_loop, "start = load_latest", "nobody runs ahead")'
    assert show_problems(cells(good), "planted") == []
    assert show_calls(cells(good), "planted")[0], "the call is found"
    assert any("no line" in p for p in show_problems(cells(good.replace("load_latest", "load_last")), "planted"))
    assert any("no line" in p for p in show_problems(cells(good.replace("nobody", "no one")), "planted"))
    assert any("'train_lop'" in p for p in show_problems(cells(good.replace("train_loop", "train_lop")), "planted"))
    assert any("literal" in p for p in show_problems(cells('s = "start"\nddlcourse.show(elastic.train_loop, s)'),
                                                     "planted"))
    assert any("NBVAL_CHECK_OUTPUT" in p for p in show_problems(cells("# NBVAL_CHECK_OUTPUT\n" + good), "planted"))
    assert any("not an object" in p for p in show_problems(cells("ddlcourse.show(dcp.train_phase)"), "planted")), \
        "a module the notebook did not import"
    assert show_problems(cells("from ddlcourse import show\nshow(elastic.train_loop)"), "planted") == []
