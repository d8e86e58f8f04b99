"""Files that ranks on other nodes read live on the shared file system, never in a node-local temporary folder.

On a cluster each node has its own /tmp: a checkpoint that rank 0 wrote to ``tempfile.mkdtemp()`` on the
notebook's node is not there for the ranks of node 2 (they resumed at step 0 while rank 0 resumed at step 125,
and the collectives hung). Notebooks and the package make such folders with ``training.run_dir``.
"""
import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The only temporary folders the package may make, each with the reason it is not a shared-file problem.
ALLOWED = {
    "ddlcourse/cluster/mpicluster.py": "the cluster's profile folder, made under runtime_dir() (the home or test root)",
    "ddlcourse/cluster/forkserver.py": "shared: a fork server's socket, made in the folder its caller names; ranks of this host only",
    "ddlcourse/datapipe.py": "scratch_dir: made under the data cache root, which the learner points at a file system",
    "instructor/browser.py": "headless Chromium's own profile for the slide checks, on the instructor's machine",
    "ddlcourse/exercises/rehearsal.py": "rehearse: the simulated ranks' socket and logs, under runtime_dir(); "
                                        "processes of this host only",
}


def _tempfile_calls(tree) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "tempfile"]


def test_no_notebook_writes_to_a_temporary_folder():
    bad = []
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if cell["cell_type"] == "code" and ("tempfile" in src or "/tmp/" in src):
                bad.append(f"{nb.name} cell {i}")
    assert not bad, f"use training.run_dir(name) (shared file system) instead of a temporary folder: {bad}"


def test_the_package_makes_temporary_folders_only_where_allowed():
    bad = []
    for f in sorted((ROOT / "ddlcourse").rglob("*.py")) + sorted((ROOT / "instructor").rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        lines = _tempfile_calls(ast.parse(f.read_text()))
        if lines and rel not in ALLOWED:
            bad.append(f"{rel}:{lines}")
    assert not bad, f"tempfile in modules whose files other nodes may read (use training.run_dir): {bad}"


def test_the_rule_sees_a_temporary_checkpoint_folder():
    assert _tempfile_calls(ast.parse("import tempfile\nckpt = tempfile.mkdtemp(prefix='ddl-dcp-')\n")) == [2]
