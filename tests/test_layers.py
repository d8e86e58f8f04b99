"""The package's map and its layers.

* Each package's docstring is its map: a ``Modules`` section that lists every module (and sub-package) of the
  folder, one line each.
* ``ddlcourse``'s own map groups its modules in layers, from the bottom up: runtime, core, mechanisms,
  experiments, exercises, tools. A module imports only from its own layer and the layers below it: no import,
  at the top of a module or inside a function, reaches up.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG_DIR = ROOT / "ddlcourse"
LAYERS = ("runtime", "core", "mechanisms", "experiments", "exercises", "tools")


def map_of(doc: str) -> dict[str, str]:
    """``{name: layer or ""}`` of a docstring's ``Modules`` section: entries are ``name  text`` lines (``name/``
    for a sub-package); a line ``layer: ...`` at the margin starts a layer (the top-level map only)."""
    lines = (doc or "").splitlines()
    if "Modules" not in [l.strip() for l in lines]:
        return {}
    out, layer = {}, ""
    for line in lines[[l.strip() for l in lines].index("Modules") + 2:]:
        if not line.strip():
            break
        head = re.match(r"^(\w+): ", line)
        if head and head.group(1) in LAYERS:
            layer = head.group(1)
            continue
        m = re.match(r"^\s*([\w<>]+/?)\s{2,}\S", line)
        if m:
            name = m.group(1).rstrip("/")
            assert name not in out, f"{name} is listed twice in the map"
            out[name] = layer
    return out


def members(folder: Path) -> set[str]:
    """The modules and sub-packages of a package folder (``__init__`` excluded)."""
    return ({f.stem for f in folder.glob("*.py") if f.stem != "__init__"}
            | {d.name for d in folder.iterdir() if (d / "__init__.py").exists()})


def packages() -> list[Path]:
    return [PKG_DIR] + sorted(d.parent for d in PKG_DIR.rglob("__init__.py") if d.parent != PKG_DIR)


def test_every_package_docstring_lists_its_modules():
    problems = []
    for folder in packages():
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        listed, present = set(map_of(doc)), members(folder)
        name = ".".join(folder.relative_to(ROOT).parts)
        if present - listed:
            problems.append(f"{name}: not in its docstring's Modules map: {sorted(present - listed)}")
        if listed - present:
            problems.append(f"{name}: its map lists what is not there: {sorted(listed - present)}")
    assert not problems, "\n".join(problems)


def layer_table() -> dict[str, int]:
    """``{top-level module or sub-package: layer index}`` from ``ddlcourse``'s map."""
    table = map_of(ast.get_docstring(ast.parse((PKG_DIR / "__init__.py").read_text())))
    assert set(table.values()) == set(LAYERS), f"the top-level map has the layers {set(table.values())}"
    return {name: LAYERS.index(layer) for name, layer in table.items()}


def module_sources() -> dict[str, str]:
    out = {}
    for f in sorted(PKG_DIR.rglob("*.py")):
        parts = f.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f.read_text()
    return out


def imported(name: str, src: str) -> set[str]:
    """The ddlcourse modules ``src`` (module ``name``) imports, at its top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("ddlcourse")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                        # relative: from the module's own package
                pkg = name.split(".")[:-node.level] if not name.endswith("__init__") else name.split(".")
                base = ".".join(pkg + ([base] if base else []))
            if base.startswith("ddlcourse"):
                out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return out


def upward_imports(sources: dict[str, str], table: dict[str, int]) -> list[str]:
    """``importer -> imported`` pairs where the imported module sits in a higher layer than its importer."""
    def layer(mod: str) -> int | None:
        parts = mod.split(".")
        return table.get(parts[1]) if len(parts) > 1 else None   # `ddlcourse` itself belongs to no layer

    bad = []
    for name, src in sources.items():
        mine = layer(name)
        if mine is None:
            continue
        for target in sorted(imported(name, src)):
            theirs = layer(target)
            if theirs is not None and theirs > mine:
                bad.append(f"{name} ({LAYERS[mine]}) imports {target} ({LAYERS[theirs]})")
    return bad


def test_every_module_has_one_layer():
    table = layer_table()
    missing = members(PKG_DIR) - set(table)
    assert not missing, f"modules of ddlcourse/ with no layer in its map: {sorted(missing)}"


def test_no_module_imports_from_a_layer_above_it():
    bad = upward_imports(module_sources(), layer_table())
    assert not bad, "imports that reach up a layer (move the code down, or the caller up):\n" + "\n".join(bad)


def test_the_rule_finds_a_planted_upward_import():
    sources = module_sources()
    table = layer_table()
    assert upward_imports(sources, table) == []
    sources["ddlcourse.grid"] += "\n\ndef _leak():\n    from ddlcourse.parallel import syncbn\n"
    sources["ddlcourse.cluster.launch"] += "\nimport ddlcourse.dist\n"
    assert upward_imports(sources, table) == [
        "ddlcourse.cluster.launch (runtime) imports ddlcourse.dist (core)",
        "ddlcourse.grid (core) imports ddlcourse.parallel (mechanisms)",
        "ddlcourse.grid (core) imports ddlcourse.parallel.syncbn (mechanisms)"]


@pytest.mark.parametrize("doc, want", [
    ("Modules\n-------\na   the a\nb/  the b\n\nmore text", {"a": "", "b": ""}),
    ("Modules\n-------\ncore: first\n  x   the x\ntools: last\n  y   the y\n", {"x": "core", "y": "tools"}),
    ("no map here", {}),
])
def test_the_map_reader(doc, want):
    assert map_of(doc) == want
