"""Author a notebook as a percent-format script, then convert it:

    .venv/bin/python env/py2nb.py src.py notebooks/NN_topic.ipynb

Cells start with ``# %%`` (code) or ``# %% [markdown]``; an optional JSON object after the marker
becomes the cell's metadata, e.g. ``# %% [markdown] {"slideshow": {"slide_type": "slide"}}``.
Markdown cells are written as ``#``-comment lines (the leading "# " is stripped).
The .ipynb is what the repo keeps; env/nbexec.py executes it and keeps the checked outputs.
"""
import json
import re
import sys

import nbformat

MARK = re.compile(r"^# %%(?P<md> \[markdown\])?(?P<meta> \{.*\})?\s*$")


def convert(text: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    cells, cur = [], None
    for line in text.splitlines():
        m = MARK.match(line)
        if m:
            cur = {"md": bool(m.group("md")), "meta": json.loads(m.group("meta")) if m.group("meta") else {}, "lines": []}
            cells.append(cur)
        elif cur is not None:
            cur["lines"].append(line)
    for c in cells:
        lines = c["lines"]
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        if c["md"]:
            src = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in lines)
            cell = nbformat.v4.new_markdown_cell(src)
        else:
            cell = nbformat.v4.new_code_cell("\n".join(lines))
        cell.metadata.update(c["meta"])
        nb.cells.append(cell)
    for i, cell in enumerate(nb.cells):  # stable ids keep diffs small
        cell["id"] = f"c{i:03d}"
    return nb


if __name__ == "__main__":
    src, dst = sys.argv[1], sys.argv[2]
    nbformat.write(convert(open(src).read()), dst)
    print(f"wrote {dst}")
