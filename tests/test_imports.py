"""The package's imports tell the truth (issue 28), read from the source with ``ast``, nothing imported.

* No import cycle among module-level imports: the graph a reader draws from the top of each file is the
  order Python loads them in, and a cycle there breaks as soon as one module uses a name at import time.
* No import of a ``ddlcourse`` module inside a function, except the few listed in ``LAZY_ALLOWED`` (they
  pull in an optional heavy package, or are the command line, which imports only what its command runs)
  and the modules still ``PENDING``. A function-level import hides an edge of the graph (often a cycle)
  and moves an import error from import time to the middle of a run.
* No file of ``ddlcourse/`` over ``MAX_LINES`` lines, except ``LONG_ALLOWED``.

The checks are functions of ``{module name: source}``, so the tests at the end feed them small made-up
packages and show that each rule catches what it is meant to catch.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import ROOT, module_command

PKG_DIR = Path(__file__).resolve().parents[1] / "ddlcourse"
PKG = "ddlcourse"
MAX_LINES = 600
LONG_ALLOWED = {"ddlcourse.tools.plan", "ddlcourse.perfmodel"}    # two tables of numbers, read top to bottom

# (importer, imported module) pairs that may stay inside a function: "*" means any module.
LAZY_ALLOWED = {
    ("ddlcourse.__main__", "*"),            # the command line imports a command's module when it runs: `plan`
                                            # alone costs 2.5 CPU-s, paid on every rank of `check` and `run`
    ("*", "ddlcourse.plots_timeline"),      # imports matplotlib at its top: optional, slow to import
    ("ddlcourse.selfcheck", "ddlcourse.exercises"),   # finds the exercise modules only when asked
    # the exercises layer stands on selfcheck (every checker imports it at its top, and so does a simulated rank):
    # selfcheck reaches the rehearsal and the simulated rank only when a distributed check runs
    ("ddlcourse.selfcheck", "ddlcourse.exercises.rehearsal"),
    ("ddlcourse.selfcheck", "ddlcourse.exercises.simworld"),
}

PENDING: set[str] = set()            # modules whose function-level imports are still to be moved (none)
PENDING_PREFIXES: tuple[str, ...] = ()


# --------------------------------------------------------------------------- reading the package
def module_name(path: Path, root: Path = PKG_DIR) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_sources(root: Path = PKG_DIR) -> dict[str, tuple[str, bool]]:
    """``{module name: (source, is a package's __init__)}`` for every ``.py`` file under ``root``."""
    return {module_name(p, root): (p.read_text(), p.name == "__init__.py") for p in sorted(root.rglob("*.py"))}


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool, known: set[str]) -> list[str]:
    """The package modules an import statement loads (``from ddlcourse import dist`` -> ``ddlcourse.dist``)."""
    def longest_known(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    if isinstance(node, ast.Import):
        names = [a.name for a in node.names if a.name.split(".")[0] == PKG]
        return [t for t in map(longest_known, names) if t]
    base = node.module or ""
    if node.level:                                    # relative: from . import x, from ..data import y
        here = module.split(".") if is_pkg else module.split(".")[:-1]
        here = here[:len(here) - node.level + 1]
        base = ".".join(here + ([base] if base else []))
    if base.split(".")[0] != PKG:
        return []
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        t = sub if sub in known else longest_known(base)
        if t and t not in out:
            out.append(t)
    return out


def package_imports(sources: dict[str, tuple[str, bool]]):
    """Every intra-package import: ``(importer, imported, line, inside a function)``."""
    known = set(sources)
    found = []
    for module, (src, is_pkg) in sources.items():
        tree = ast.parse(src)

        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for t in _targets(child, module, is_pkg, known):
                        if t != module:
                            found.append((module, t, child.lineno, in_function))
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                ast.Lambda)))
        visit(tree, False)
    return found


# --------------------------------------------------------------------------- the three rules
def import_cycles(sources) -> list[list[str]]:
    """Cycles of the module-level import graph, each as ``[a, b, ..., a]`` (one per strongly connected part)."""
    graph: dict[str, set[str]] = {m: set() for m in sources}
    for a, b, _, lazy in package_imports(sources):
        if not lazy:
            graph[a].add(b)
    # Tarjan's strongly connected components, iterative: a part of two or more modules holds a cycle.
    index, low, stack, on_stack, parts, counter = {}, {}, [], set(), [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    part = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        part.append(w)
                        if w == v:
                            break
                    if len(part) > 1:
                        parts.append(set(part))
    return [_a_cycle(graph, part) for part in parts]


def _a_cycle(graph, part: set[str]) -> list[str]:
    """One concrete cycle through the smallest module of a strongly connected part (breadth first)."""
    start = min(part)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & part):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    raise AssertionError(f"no cycle through {start} in {sorted(part)}")   # a strongly connected part has one


def pending(module: str) -> bool:
    return module in PENDING or module.startswith(PENDING_PREFIXES)


def lazy_imports(sources) -> list[str]:
    """Function-level imports of package modules that no rule allows, as ``"importer:line -> imported"``."""
    return [f"{a}:{line} -> {b}" for a, b, line, lazy in package_imports(sources)
            if lazy and not pending(a) and not {(a, b), ("*", b), (a, "*")} & LAZY_ALLOWED]


def long_files(sources) -> list[str]:
    return [f"{m}: {len(src.splitlines())} lines" for m, (src, _) in sources.items()
            if len(src.splitlines()) > MAX_LINES and m not in LONG_ALLOWED]


# --------------------------------------------------------------------------- the package
@pytest.fixture(scope="module")
def sources():
    return package_sources()


def test_the_package_is_read(sources):
    """The walk finds the package and its imports (so the rules below have something to look at)."""
    assert {"ddlcourse", "ddlcourse.dist", "ddlcourse.cluster", "ddlcourse.parallel.data_parallel"} <= set(sources)
    assert any(b == "ddlcourse.dist" for _, b, _, lazy in package_imports(sources) if not lazy)


def test_no_import_cycle(sources):
    cycles = import_cycles(sources)
    assert not cycles, "module-level import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_package_imports_at_module_top(sources):
    found = lazy_imports(sources)
    assert not found, ("imports of ddlcourse modules inside functions (move them to the top of the module; "
                       "only optional heavy pieces stay lazy, listed in LAZY_ALLOWED):\n" + "\n".join(found))


def test_no_long_file(sources):
    found = long_files(sources)
    assert not found, f"files over {MAX_LINES} lines (split them by what they do):\n" + "\n".join(found)


def test_pending_and_allowed_names_exist(sources):
    """A stale name in an allow-list would silently allow nothing; every listed module must exist."""
    listed = ({b for _, b in LAZY_ALLOWED} | {a for a, _ in LAZY_ALLOWED}) - {"*"} | LONG_ALLOWED
    assert listed <= set(sources), sorted(listed - set(sources))


# --------------------------------------------------------------------------- the rules catch what they should
def _fake(**modules: str) -> dict[str, tuple[str, bool]]:
    """A made-up package: ``_fake(a="from ddlcourse import b")`` is module ``ddlcourse.a``."""
    out = {"ddlcourse": ("", True)}
    for name, src in modules.items():
        out[f"ddlcourse.{name}"] = (src, False)
    return out


def test_a_cycle_is_found_and_named():
    src = _fake(a="from ddlcourse import b\n", b="import ddlcourse.c\n", c="from ddlcourse.a import f\n",
                d="from ddlcourse import a\n")
    assert import_cycles(src) == [["ddlcourse.a", "ddlcourse.b", "ddlcourse.c", "ddlcourse.a"]]
    lazy = _fake(a="from ddlcourse import b\n", b="def f():\n    from ddlcourse import a\n")
    assert import_cycles(lazy) == []             # a function-level import is no edge of the load order ...
    assert lazy_imports(lazy) == ["ddlcourse.b:2 -> ddlcourse.a"]   # ... and is reported by the next rule


def test_relative_and_submodule_imports_resolve():
    src = {"ddlcourse": ("", True), "ddlcourse.parallel": ("from . import x\n", True),
           "ddlcourse.parallel.x": ("from ..y import f\n", False), "ddlcourse.y": ("from .parallel import x\n", False)}
    assert import_cycles(src) == [["ddlcourse.parallel.x", "ddlcourse.y", "ddlcourse.parallel.x"]]


def test_lazy_import_rule_allows_only_listed_pairs():
    src = _fake(plots_timeline="import matplotlib\n", selfcheck="def f():\n    import ddlcourse.exercises\n",
                exercises="", x="def f():\n    from ddlcourse.plots_timeline import COLORS\n    import mpi4py\n")
    assert lazy_imports(src) == []
    src["ddlcourse.x"] = ("def f():\n    from ddlcourse import selfcheck\n", False)
    assert lazy_imports(src) == ["ddlcourse.x:2 -> ddlcourse.selfcheck"]
    src["ddlcourse.x"] = ("", False)
    src["ddlcourse.__main__"] = ("def f():\n    from ddlcourse import selfcheck, x\n", False)  # any, from there
    assert lazy_imports(src) == []


def test_long_file_rule():
    assert long_files(_fake(a="x = 1\n" * MAX_LINES, **{"tools.plan": "x = 1\n" * (MAX_LINES + 1)})) == []
    assert long_files(_fake(a="x = 1\n" * (MAX_LINES + 1))) == [f"ddlcourse.a: {MAX_LINES + 1} lines"]


def test_importing_the_package_skips_the_exit_collection():
    """``import ddlcourse`` freezes the objects at exit (gc.freeze), so a process with torch loaded leaves in a
    fraction of the time (env/bench_cluster.py prints both). The trade-off, shown here: a reference cycle's
    finaliser no longer runs at exit; without the package it does."""
    import subprocess

    plain = subprocess.run(module_command("imports_exit_cycle", "plain"), capture_output=True, text=True, check=True,
                           cwd=ROOT)
    course = subprocess.run(module_command("imports_exit_cycle", "course"), capture_output=True, text=True, check=True,
                            cwd=ROOT)
    assert "finalised at exit" in plain.stdout
    assert "finalised at exit" not in course.stdout
