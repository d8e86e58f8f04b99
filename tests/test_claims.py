"""Every claim a checked cell states is true.

A checked cell (``# NBVAL_CHECK_OUTPUT``) that prints ``<claim>: False`` passes nbval as long as the stored output
says False too: a false statement that the tests keep. This test reads the stored output of every checked cell
(nbval then holds every smoke-scale run to it) and fails on any ``<claim>: <bool>`` line that is not True.
Phrase an intended negative as a positive claim: "7B with plain data parallelism does not fit in 80 GB: True".
"""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))
CLAIM = re.compile(r"^(?P<claim>\S.*?):\s+(?P<value>True|False)\s*$")


def _text(output) -> str:
    if output.get("output_type") == "stream":
        t = output.get("text", "")
    else:
        t = output.get("data", {}).get("text/plain", "")
    return "".join(t) if isinstance(t, list) else t


def false_claims(path: Path) -> list[str]:
    """The ``<claim>: False`` lines in the stored outputs of a notebook's checked cells."""
    bad = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] != "code" or "# NBVAL_CHECK_OUTPUT" not in src:
            continue
        for out in cell.get("outputs", []):
            for line in _text(out).splitlines():
                m = CLAIM.match(line.strip())
                if m and m.group("value") == "False":
                    bad.append(f"cell {i}: {line.strip()}")
    return bad


def test_every_checked_claim_is_true():
    bad = {p.name: false_claims(p) for p in NOTEBOOKS}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"checked cells that state a false claim: {bad}"


def test_a_false_claim_is_found(tmp_path):
    nb = tmp_path / "x.ipynb"
    cell = {"cell_type": "code", "source": "# NBVAL_CHECK_OUTPUT\nprint(...)", "outputs": [
        {"output_type": "stream", "name": "stdout",
         "text": "agrees with serial: True\ncontiguous: the last rank computes (4cp-3)/3 times the first: False\n"}]}
    nb.write_text(json.dumps({"cells": [cell]}))
    assert false_claims(nb) == ["cell 0: contiguous: the last rank computes (4cp-3)/3 times the first: False"]
