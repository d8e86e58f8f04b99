"""The course as a book: every notebook and lab, run, in one static site (Sphinx with MyST-NB and the book theme).

    python -m instructor.book build [--scale laptop|smoke|cluster] [--execute all|none] [--decks build|copy]

``make book`` runs it. The build

* runs every notebook and lab at the build's scale (``laptop`` unless ``--scale`` says otherwise) through
  :func:`instructor.slides.executed_copy`: the cache of ``make slides`` (slides/build/executed, same keys), with the
  solutions hidden. ``--execute none`` runs nothing: a notebook no run has made yet is shown as stored, and says so;
* builds the decks and their PDF handouts from those runs (:func:`instructor.slides.build`, which runs again a
  notebook whose run no longer matches the package, edited meanwhile); ``--decks copy`` takes the ones slides/decks
  and slides/pdf hold;
* writes the book's sources into book/_build/src (``out``/src): each notebook with a note on the run its outputs
  come from, every "notebook NN" and "lab N" of its text linked to that page, and the live-only widget outputs
  (progress bars) dropped; a page per part with its notebooks and its decks; the exercises page; the decks, their
  PDFs and slides/vendor beside them;
* runs Sphinx with book/conf.py into book/_build/html (``out``/html), every warning an error (so a broken
  cross-reference fails the build).

Nothing in the site comes from outside it: the theme ships its assets, KaTeX's script comes with sphinxcontrib-katex,
its CSS and fonts from slides/vendor (``make setup``). tests/test_book.py opens every page in headless Chromium.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ddlcourse import selfcheck as sc
from ddlcourse.config import SCALES
from instructor import slides, talk

ROOT = slides.ROOT
BOOK = ROOT / "book"
OUT = BOOK / "_build"               # the sources in OUT/src, the site in OUT/html
SITE_DATA = "book.json"             # in the sources: what book/conf.py needs to know about this build

PART = re.compile(r"^\*\*(Part \d+ · [^*]+)\*\*", re.M)
LAB = re.compile(r"^\*\*Lab (\d+) of \d+\*\*", re.M)
LABS = "Case-study labs"
WIDGET = "application/vnd.jupyter.widget-view+json"


class BuildError(RuntimeError):
    """The book cannot be built as the course stands (a notebook names no part, a run failed)."""


@dataclass
class Chapter:
    path: Path              # relative to the repository: notebooks/04_collectives.ipynb
    title: str              # its first heading
    part: str               # "Part 2 · Data parallelism", or LABS
    ref: tuple[str, str]    # how the course's text names it: ("notebook", "04") or ("lab", "2")

    @property
    def topic(self) -> str:
        """Its exercises' module name: collectives for 04_collectives (ddlcourse/exercises/checkers/<topic>.py)."""
        return self.path.stem.split("_", 1)[1]

    @property
    def doc(self) -> str:
        return self.path.with_suffix("").as_posix()


def chapters() -> list[Chapter]:
    """Every notebook, then every lab, in the course's order, with the part its header names."""
    out = []
    for p in sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb")):
        rel = p.relative_to(ROOT)
        head = nbformat.read(p, as_version=4).cells[0].source
        part, lab = PART.search(head), LAB.search(head)
        title = re.search(r"^#\s+(.+)$", head, re.M)
        if not title or not (part or lab):
            raise BuildError(f"{rel}: its first cell has no '# title' or names no part ('**Part N · Name**' or "
                             "'**Lab N of M**')")
        ref = ("lab", lab.group(1)) if lab else ("notebook", p.stem[:2])
        out.append(Chapter(rel, title.group(1).strip(), part.group(1).strip() if part else LABS, ref))
    return out


def parts(chs: list[Chapter]) -> dict[str, list[Chapter]]:
    """The chapters by part, the parts in the order of their first chapter."""
    out: dict[str, list[Chapter]] = {}
    for ch in chs:
        out.setdefault(ch.part, []).append(ch)
    return out


def part_doc(part: str) -> str:
    return "labs" if part == LABS else "part" + re.match(r"Part (\d+)", part).group(1)


# --------------------------------------------------------------------------- a notebook's page
REF = re.compile(r"\b(?P<word>[Nn]otebooks?|[Ll]abs?) (?P<nums>\d+(?:(?:, | and | or |–|-)\d+)*)\b")
# spans of markdown a link must not go into: code, math, links
KEEP = re.compile(r"```.*?```|`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]*\$|\[[^\]\n]*\]\([^)\n]*\)", re.S)


def link_references(text: str, here: Chapter, targets: dict[tuple[str, str], Chapter]) -> str:
    """``text`` (markdown) with each "notebook NN" and "lab N" that names another chapter linked to its page."""
    def link(kind: str, num: str, label: str) -> str:
        ch = targets.get((kind, num if kind == "lab" else num.zfill(2)))
        if ch is None or ch is here:
            return label
        return f"[{label}]({os.path.relpath(ch.path, here.path.parent).replace(os.sep, '/')})"

    def refs(m: re.Match) -> str:
        kind = "lab" if m["word"].lower().startswith("lab") else "notebook"
        if m["nums"].isdigit():
            return link(kind, m["nums"], m.group())
        return m["word"] + " " + re.sub(r"\d+", lambda n: link(kind, n.group(), n.group()), m["nums"])

    out, last = [], 0
    for keep in KEEP.finditer(text):
        out += [REF.sub(refs, text[last:keep.start()]), keep.group()]
        last = keep.end()
    return "".join(out + [REF.sub(refs, text[last:])])


def run_of(ch: Chapter, nb, scale: str) -> dict | None:
    """What :func:`instructor.slides.executed_copy` recorded of the run ``nb`` comes from: None where there is no
    run at ``scale``, ``machine`` None for a run cached before runs were recorded."""
    if not slides.cache_path(ROOT / ch.path, scale).exists():
        return None
    return dict(nb.metadata.get(slides.RUN_KEY) or {"scale": scale, "machine": None})


def run_note(run: dict | None, scale: str) -> str:
    if run is None:
        return (f"```{{warning}}\nNo run at the {scale} scale yet: this page shows the notebook as the course stores "
                f"it (`make book SCALE={scale}` runs it).\n```")
    if run["machine"] is None:
        return f"```{{note}}\nOutputs and figures: a run at the {scale} scale on a machine it did not record.\n```"
    return (f"```{{note}}\nOutputs and figures: a run at the {run['scale']} scale on {run['machine']}, "
            f"{run['started'].replace('T', ' ')}, {run['seconds']:.0f} s. Timings and speedups are that machine's; "
            "yours will differ.\n```")


def page_of(ch: Chapter, nb, run: dict | None, targets: dict, scale: str) -> nbformat.NotebookNode:
    """The book's copy of a chapter: the note on its run under its title, references linked, no widget outputs."""
    nb = nbformat.from_dict(nb)
    nb.metadata.pop("widgets", None)
    for c in nb.cells:
        if c.cell_type == "markdown":
            c.source = link_references(c.source, ch, targets)
        elif c.cell_type == "code":      # a progress bar lives only in a running kernel
            c.outputs = [o for o in c.outputs if WIDGET not in o.get("data", {})]
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(run_note(run, scale), id="book-run"))
    return nb


# --------------------------------------------------------------------------- the exercises page
def _messages(module) -> list[str]:
    """The messages of a checker module: its strings of more than two words, docstrings aside, an f-string whole
    with "…" for each value it formats."""
    tree = ast.parse(inspect.getsource(module))
    skip = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    skip |= {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
             and n.body and isinstance(n.body[0], ast.Expr)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            out.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values))
    return [" ".join(m.split()) for m in out if len(m.split()) > 2]


def hints(ex: sc.CodeExercise) -> list[str]:
    """The hints of a coding exercise: for each typical mistake its checker names, the checker's message with the
    mistake's registered hint (the shortest that starts with it, else the shortest that has it, else the hint
    itself), then the exercise's own hints."""
    texts = _messages(sys.modules[ex.checker.__module__])
    out = []
    for _, fragment in ex.mistakes:
        found = [t for t in texts if t.startswith(fragment)] or [t for t in texts if fragment in t] or [fragment]
        out.append(min(found, key=len).strip())
    out += [" ".join(h.split()) for h in ex.hints.values()]
    return list(dict.fromkeys(out))


def _plain(text: str) -> str:
    """Text for markdown: backquoted code kept, every other character markdown or MyST would read escaped."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(p if p.startswith("`") else re.sub(r"([\\*_\[\]<>$|{}#])", r"\\\1", p) for p in parts)


def _topic(fn) -> str | None:
    """The topic of a checker of the course (its module's name under ``selfcheck.CHECKERS_PACKAGE``); None for one
    registered elsewhere (a test's planted exercise, in the same process)."""
    package, _, topic = fn.__module__.rpartition(".")
    return topic if package == sc.CHECKERS_PACKAGE else None


CALLS = re.compile(r"""\b(check_code|use_checked|check)\(\s*["']([A-Za-z0-9_]+)["']""")


def exercises_page(chs: list[Chapter]) -> str:
    """Every build-it exercise and checked question, by notebook in the course's order, with its hints; never a
    solution."""
    sc._load_all()
    code = {n: _topic(ex.checker) for n, ex in sc.CODE_EXERCISES.items() if _topic(ex.checker)}
    questions = {n: _topic(fn) for n, (fn, _) in sc.EXERCISES.items() if _topic(fn)}
    topics = {ch.topic for ch in chs}
    orphans = sorted(n for n, t in {**code, **questions}.items() if t not in topics)
    if orphans:
        raise BuildError(f"exercises whose checker module names no notebook: {', '.join(orphans)}")
    lines = ["# Exercises: build it yourself", "",
             f"Every exercise of the course: {len(code)} to build and {len(questions)} questions, by notebook. A "
             "build-it is checked where you write it: `check_code(NAME, your_function, ...)` in the notebook runs it "
             "on the ranks of your cluster, and the longer ones are also files to write in an editor, checked from a "
             "terminal with `python -m ddlcourse check-exercise NAME`. When your answer is wrong the checker names "
             "the mistake it sees: its hints are listed here. The solutions are not in the book.", ""]
    for ch in chs:
        order = list(dict.fromkeys(name for cell in nbformat.read(ROOT / ch.path, as_version=4).cells
                                   if cell.cell_type == "code" for _, name in CALLS.findall(cell.source)))
        mine = [n for n in order if code.get(n) == ch.topic] + sorted(
            n for n, t in code.items() if t == ch.topic and n not in order)
        asked = [n for n in order if questions.get(n) == ch.topic] + sorted(
            n for n, t in questions.items() if t == ch.topic and n not in order)
        if not mine and not asked:
            continue
        lines += [f"## {ch.title}", "", f"In [its page]({ch.path.as_posix()}).", ""]
        for name in mine:
            ex = sc.CODE_EXERCISES[name]
            where = "checked on the ranks of a cluster" if ex.distributed else "checked in the notebook's kernel"
            terminal = ROOT / "exercises" / ch.topic / f"{name}.py"
            if terminal.exists():
                where += f"; also `exercises/{ch.topic}/{name}.py`, `python -m ddlcourse check-exercise {name}`"
            lines += [f"### Build it: `{name}`", "", f"{where.capitalize()}. The mistakes its checker names:", ""]
            lines += [f"- {_plain(h)}" for h in hints(ex)] + [""]
        if asked:
            lines += ["### Questions", ""]
            lines += [f"- `{n}`: {_plain(sc.EXERCISES[n][1])}" for n in asked] + [""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the parts and the decks
def deck_links(deck: talk.Deck, decks: dict) -> str:
    """A deck's line on a part's page: links to the deck and its handout where the book has them."""
    if deck.name not in decks:
        return f"- {deck.title}: not built yet (`make slides`)"
    pdf = f' · <a href="slides/pdf/{deck.name}.pdf">PDF handout with the speaker notes</a>' \
        if decks[deck.name]["pdf"] else ""
    return (f'- <a href="slides/decks/{deck.name}.html">{deck.title}</a> ({deck.minutes} min, figures at the '
            f"{decks[deck.name]['scale']} scale){pdf}")


def decks_by_part(chs: list[Chapter]) -> dict[str | None, list[talk.Deck]]:
    """The decks of each part (all of whose notebooks are in it); None: the decks that span parts."""
    part_of = {ch.path.as_posix(): ch.part for ch in chs}
    out: dict[str | None, list[talk.Deck]] = {}
    for d in talk.load_decks():
        found = {part_of.get(p) for p in d.notebook_paths()}
        out.setdefault(found.pop() if len(found) == 1 else None, []).append(d)
    return out


def copy_assets(assets: Path) -> dict[str, dict]:
    """Copy what the site shows as it is into ``assets``: KaTeX's CSS and fonts (static/katex), and slides/vendor,
    the decks slides/decks holds and their PDFs (extra/slides). The decks copied: name -> {"scale": of their
    figures, "pdf": whether their handout is there}."""
    shutil.rmtree(assets, ignore_errors=True)
    shutil.copytree(slides.VENDOR / "katex", assets / "static" / "katex",
                    ignore=shutil.ignore_patterns("*.mjs", "*.js", "contrib"))
    out = assets / "extra" / "slides"
    shutil.copytree(slides.VENDOR, out / "vendor")
    (out / "decks").mkdir()
    (out / "pdf").mkdir()
    manifest = slides.SLIDES / "decks" / "manifest.json"
    copied = {}
    for d in json.loads(manifest.read_text()) if manifest.exists() else []:
        deck, pdf = slides.SLIDES / "decks" / f"{d['name']}.html", slides.SLIDES / "pdf" / f"{d['name']}.pdf"
        if deck.exists():
            shutil.copy2(deck, out / "decks" / deck.name)
            if pdf.exists():
                shutil.copy2(pdf, out / "pdf" / pdf.name)
            copied[d["name"]] = {"scale": d["scale"], "pdf": (out / "pdf" / pdf.name).exists()}
    return copied


def part_page(part: str, chs: list[Chapter], its_decks: list[talk.Deck], decks: dict) -> str:
    first, last = chs[0].path.stem[:2], chs[-1].path.stem[:2]
    what = f"Labs {int(first)} to {int(last)}" if part == LABS else f"Notebooks {first} to {last}"
    lines = [f"# {part}", "", f"{what}, in order: each names what it assumes, what you will learn, and how long it "
             "runs. The exercises of each are listed, with their hints, on the [exercises page](exercises.md).", ""]
    if its_decks:
        lines += ["## Slides", "", "The talk that goes with this part, and its handout (each slide, then its speaker "
                  "notes):", ""] + [deck_links(d, decks) for d in its_decks] + [""]
    lines += ["## Notebooks" if part != LABS else "## Labs", "", "```{toctree}", ":maxdepth: 1", ""]
    lines += ["/" + ch.doc for ch in chs] + ["```", ""]
    return "\n".join(lines)


def index_page(by_part: dict[str, list[Chapter]], course_decks: list[talk.Deck], decks: dict) -> str:
    lines = [(BOOK / "index.md").read_text(encoding="utf-8").rstrip(), ""]
    if course_decks:
        lines += ["## Slides for the whole course", ""] + [deck_links(d, decks) for d in course_decks] + [""]
    lines += ["```{toctree}", ":maxdepth: 1", ":caption: The course", ""]
    lines += [part_doc(p) for p in by_part] + ["exercises", "```", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the build
def _write(path: Path, text: str, written: set) -> None:
    """Write ``text`` unless the file already holds it (Sphinx then reads again only what changed)."""
    written.add(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def site_line(runs: dict[str, dict | None], scale: str) -> str:
    """The line every page shows: the scale and the machine its outputs and figures come from."""
    machines = sorted({r["machine"] or "a machine it did not record" for r in runs.values() if r})
    missing = sum(r is None for r in runs.values())
    if not machines:
        return f"No notebook has been run at the {scale} scale yet: the pages show them as the course stores them."
    where = machines[0] if len(machines) == 1 else f"{len(machines)} machines (each page names its own)"
    line = f"Outputs and figures: notebooks run at the {scale} scale on {where}."
    return line + (f" {missing} not run yet." if missing else "")


def pages(html: Path) -> list[Path]:
    """The book's pages in a built site (the decks copied beside them are not)."""
    return sorted(p for p in html.rglob("*.html") if p.relative_to(html).parts[0] not in ("slides", "_static"))


@dataclass
class Built:
    html: Path
    pages: int
    ran: int                 # notebooks and labs whose run the book shows
    not_run: list[str]
    decks: dict              # the decks in it: what copy_assets returned
    seconds: dict            # step -> wall seconds


def build(scale: str = "laptop", execute: str = "all", decks: str = "build", out: Path = OUT, log=print) -> Built:
    """Build the book into ``out``/html (see the module's docstring)."""
    src, html = out / "src", out / "html"
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if execute not in ("all", "none") or decks not in ("build", "copy"):
        raise ValueError(f"execute is 'all' or 'none', decks 'build' or 'copy'; got {execute!r}, {decks!r}")
    if not (slides.VENDOR / "katex" / "katex.min.css").exists():
        raise FileNotFoundError(f"{slides.VENDOR} has no KaTeX: run 'make setup' (it installs the slide assets "
                                "with npm)")
    seconds, t0 = {}, time.perf_counter()
    chs = chapters()
    nbs = {}
    for ch in chs:
        t = time.perf_counter()
        try:
            nbs[ch.path] = slides.executed_copy(ROOT / ch.path, execute == "all", scale=scale)
        except Exception as e:      # a failing cell: name the notebook, keep nbclient's last line
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
            raise BuildError(f"running {ch.path} at the {scale} scale failed: "
                             f"{text.splitlines()[-1] if text else type(e).__name__}") from e
        if execute == "all" and time.perf_counter() - t > 1:
            log(f"{ch.path}: ran in {time.perf_counter() - t:.0f} s")
    seconds["run"] = time.perf_counter() - t0
    if decks == "build":
        t = time.perf_counter()
        slides.build(scale=scale, execute=execute, placeholders=execute == "none", log=log)
        seconds["decks"] = time.perf_counter() - t

    t = time.perf_counter()
    copied = copy_assets(src / "_assets")         # not sources: Sphinx copies them as they are
    written: set[Path] = set()
    targets = {ch.ref: ch for ch in chs}
    runs = {ch.path.as_posix(): run_of(ch, nbs[ch.path], scale) for ch in chs}
    for ch in chs:
        page = page_of(ch, nbs[ch.path], runs[ch.path.as_posix()], targets, scale)
        _write(src / ch.path, nbformat.writes(page), written)
    by_part, deck_parts = parts(chs), decks_by_part(chs)
    for part, members in by_part.items():
        _write(src / f"{part_doc(part)}.md", part_page(part, members, deck_parts.get(part, []), copied), written)
    _write(src / "exercises.md", exercises_page(chs), written)
    _write(src / "index.md", index_page(by_part, deck_parts.get(None, []), copied), written)
    _write(src / SITE_DATA, json.dumps({"announcement": site_line(runs, scale), "scale": scale}, indent=1), written)
    for old in [p for p in src.rglob("*") if p.is_file() and p not in written and "_assets" not in p.parts]:
        old.unlink()          # a page that is no longer in the course
    seconds["sources"] = time.perf_counter() - t

    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-c", str(BOOK), "-W", "--keep-going", "-q",
                        "-j", "auto", str(src), str(html)], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, DDLCOURSE_BOOK_SRC=str(src)))
    seconds["sphinx"] = time.perf_counter() - t
    if p.returncode != 0:
        raise BuildError(f"Sphinx failed ({p.returncode}):\n{p.stderr[-6000:]}")
    not_run = [k for k, r in runs.items() if r is None]
    return Built(html, len(pages(html)), len(chs) - len(not_run), not_run, copied, seconds)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m instructor.book")
    p.add_argument("action", choices=["build"])
    p.add_argument("--scale", default="laptop", choices=SCALES,
                   help="the scale every notebook and lab runs at (laptop, the default: about 15 minutes on 2 cores "
                        "when no run is cached; smoke: about 7)")
    p.add_argument("--execute", choices=["all", "none"], default="all",
                   help="run the notebooks no run is cached of (default), or show them as stored")
    p.add_argument("--decks", choices=["build", "copy"], default="build",
                   help="build the decks and PDFs from the same runs (default), or copy those slides/ holds")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        b = build(a.scale, a.execute, a.decks)
    except BuildError as e:
        print(f"book build failed: {e}", file=sys.stderr)
        return 1
    steps = ", ".join(f"{k} {v:.0f} s" for k, v in b.seconds.items())
    print(f"book: {b.pages} pages, {b.ran} notebooks and labs with their run at the {a.scale} scale"
          + (f", {len(b.not_run)} not run ({', '.join(b.not_run)})" if b.not_run else "")
          + f"; built in {time.perf_counter() - t0:.0f} s ({steps}) -> {b.html.relative_to(ROOT)}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
