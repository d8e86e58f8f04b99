"""Build the instructor's talk decks: slides/talk/<deck>.md -> slides/decks/<deck>.html (+ slides/pdf/<deck>.pdf).

    python -m instructor.slides build [--scale smoke|laptop] [--execute all|none] [--no-pdf] [DECK ...]   # make slides
    python -m instructor.slides list         # the decks, their minutes and notebooks
    python -m instructor.slides check        # the rules every deck keeps (words, figures, notes, agenda and its
                                             # hands-on blocks: instructor.handson), no build

The decks are written for a talk (format: slides/README.md; parser and rules: instructor/talk.py). The build

* draws each ``diagram:`` image with its function in instructor/diagrams (PNG, embedded);
* takes each ``notebook:`` image from the cell with that id in the notebook executed at the build's scale
  (``smoke`` unless ``--scale`` says otherwise; cached by content hash and scale in ``slides/build/executed``).
  A missing cell, or a cell without an image output, fails the build naming the deck, the slide and the cell;
* writes a title slide naming the deck's minutes, its notebooks and the scale the figures were run at, and in the
  introduction the agenda slides from slides/AGENDA.md (front matter ``agenda: half, full``);
* prints each deck with its speaker notes to ``slides/pdf/<deck>.pdf`` with headless Chromium (a page per slide,
  and a page of notes after each slide that has notes).

Everything a deck loads comes from ``slides/vendor`` (``make setup``), so it presents offline, speaker view
(``S``: notes, next slide, timer) included.
"""
from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import io
import json
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ddlcourse.cluster.launch import available_cores
from ddlcourse.config import SCALES
from instructor import handson, talk

ROOT = Path(__file__).resolve().parent.parent
SLIDES = ROOT / "slides"
VENDOR = SLIDES / "vendor"
EXECUTED = SLIDES / "build" / "executed"


class BuildError(RuntimeError):
    """A deck cannot be built as written (a figure that does not exist); the message names deck, slide, cell."""


def decks() -> list[talk.Deck]:
    """The decks, one per file in slides/talk (their front matter is the one list of decks)."""
    return talk.load_decks()


# --------------------------------------------------------------------------- executing notebooks
def _hash_file(p: Path) -> str:
    pkg = sorted((ROOT / "ddlcourse").rglob("*.py"))
    h = hashlib.sha256(p.read_bytes())
    for f in pkg:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_path(path: Path, scale: str = "smoke") -> Path:
    tag = "" if scale == "smoke" else f"-{scale}"
    return EXECUTED / f"{path.stem}{tag}-{_hash_file(path)}.ipynb"


def machine() -> str:
    """This machine in a few words (processor, cores, memory, system): a figure's page names where it was run."""
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
              if line.startswith("model name")] if cpuinfo.exists() else []
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = models[0] if models else platform.machine()
    return f"{cpu}, {available_cores()} cores, {memory:.0f} GiB, {platform.system()}"


RUN_KEY = "ddlcourse_run"      # an executed copy's metadata: the scale, the machine, when and how long it ran


def executed_copy(path: Path, execute: bool = True, timeout: int = 3600, scale: str = "smoke") -> nbformat.NotebookNode:
    """The notebook after running it at ``scale`` (cached by the hash of it, of the package, and the scale), with
    the solutions hidden (``selfcheck.solution`` shows none: the runs are published), and the run recorded in its
    metadata (``RUN_KEY``).

    ``execute=False`` runs nothing: the cached run if there is one, else the notebook as stored."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    nb = nbformat.read(path, as_version=4)
    cache = cache_path(path, scale)
    if cache.exists():
        return nbformat.read(cache, as_version=4)
    if not execute:
        return nb
    if not nb.cells:
        raise ValueError(f"{path} has no cells")
    from nbclient import NotebookClient
    # the scale, and the inline backend so that figures become outputs (tests set MPLBACKEND=Agg)
    saved = {k: os.environ.get(k) for k in ("DDLCOURSE_SCALE", "MPLBACKEND", "PYTHONPATH", "DDLCOURSE_SOLUTIONS")}
    os.environ.update(DDLCOURSE_SCALE=scale, MPLBACKEND="module://matplotlib_inline.backend_inline",
                      PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), saved["PYTHONPATH"]])),
                      DDLCOURSE_SOLUTIONS="hidden")
    started, t0 = datetime.datetime.now(), time.perf_counter()
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        nb.metadata[RUN_KEY] = {"scale": scale, "machine": machine(), "started": started.isoformat(timespec="minutes"),
                                "seconds": round(time.perf_counter() - t0, 1)}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    cache.parent.mkdir(parents=True, exist_ok=True)
    tag = cache.stem[len(path.stem):-17]
    for old in cache.parent.glob(f"{path.stem}{tag}-*.ipynb"):
        if old.stem[len(path.stem + tag) + 1:].isalnum():   # this scale's older copies only
            old.unlink()
    nbformat.write(nb, cache)
    return nb


# --------------------------------------------------------------------------- figures
def cell_image(nb, cell_id: str) -> tuple[str, str] | None:
    """(mime type, base64 data) of the first image output of the cell ``cell_id``; None if it has none.
    KeyError if there is no such cell."""
    for c in nb.cells:
        if c.get("id") == cell_id:
            for o in c.get("outputs", []):
                for mime in ("image/png", "image/jpeg", "image/svg+xml"):
                    if mime in o.get("data", {}):
                        data = o["data"][mime]
                        data = "".join(data) if isinstance(data, list) else data
                        if mime == "image/svg+xml":
                            data = base64.b64encode(data.encode()).decode()
                        return mime, data.replace("\n", "")
            return None
    raise KeyError(cell_id)


def diagram_png(name: str, params: dict) -> str:
    """The registered diagram drawn with ``params``, as base64 PNG."""
    from instructor import diagrams
    fig = diagrams.render(name, **params)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, facecolor="white")
    fig.clf()
    return base64.b64encode(buf.getvalue()).decode()


def placeholder_png(text: str) -> str:
    """A framed card standing in for a notebook figure in a build that did not run the notebook."""
    from instructor import diagrams
    fig, ax = diagrams.canvas(8, 4.5)
    diagrams.box(ax, 0.2, 0.2, 7.6, 4.1, text, color="#F2F2F2", fontsize=13)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, facecolor="white")
    return base64.b64encode(buf.getvalue()).decode()


@dataclass
class Figures:
    """Where a build gets its figures: notebooks executed at ``scale`` (or, with ``execute=False``, cached runs,
    and a labelled placeholder for a figure no run has made yet, when ``placeholders``)."""
    scale: str = "smoke"
    execute: bool = True
    placeholders: bool = False
    notebooks: dict = field(default_factory=dict)
    placed: int = 0

    def notebook(self, rel: str, where: str = ""):
        if rel not in self.notebooks:
            try:
                self.notebooks[rel] = executed_copy(ROOT / rel, self.execute, scale=self.scale)
            except Exception as e:     # a failing cell: say which deck needed the notebook, keep the cause
                text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()      # nbclient's errors carry terminal colours
                first = text.splitlines()[-1] if text else type(e).__name__
                raise BuildError(f"{where}: running {rel} at the {self.scale} scale failed: {first}") from e
        return self.notebooks[rel]

    def uri(self, deck: talk.Deck, slide: talk.Slide, im: talk.Image) -> str:
        where = f"{deck.name}, slide line {slide.line} '{slide.title}'"
        if im.kind == "diagram":
            try:
                return "data:image/png;base64," + diagram_png(im.target, im.params)
            except Exception as e:
                raise BuildError(f"{where}: diagram {im.target}{im.params or ''} failed: {type(e).__name__}: {e}") from e
        if im.kind == "notebook":
            if not (ROOT / im.target).exists():
                raise BuildError(f"{where}: no notebook {im.target}")
            try:
                found = cell_image(self.notebook(im.target, where), im.cell)
            except KeyError:
                raise BuildError(f"{where}: {im.target} has no cell with id {im.cell!r}") from None
            if found is None:
                if self.placeholders and not self.execute:
                    self.placed += 1
                    return "data:image/png;base64," + placeholder_png(
                        f"{im.target}\ncell {im.cell}\n(figure made when the build runs the notebook)")
                raise BuildError(f"{where}: cell {im.cell!r} of {im.target} has no image output "
                                 f"(at the {self.scale} scale)")
            mime, data = found
            return f"data:{mime};base64,{data}"
        path = (deck.path.parent / im.target).resolve()
        if not path.exists():
            raise BuildError(f"{where}: no image file {im.target}")
        mime = {"svg": "image/svg+xml", "jpg": "image/jpeg", "jpeg": "image/jpeg"}.get(path.suffix[1:].lower(), "image/png")
        return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


# --------------------------------------------------------------------------- one deck
def deck_html(deck: talk.Deck, figs: Figures) -> tuple[str, int, int]:
    """(the deck's HTML, its slide count, how many slides have notes)."""
    before = figs.placed
    body = []
    for s in deck.slides:
        body.append(talk.slide_html(s, [(im.caption, figs.uri(deck, s, im)) for im in s.images]))
    line = f"figures: {figs.scale} scale"
    if figs.placed > before:
        line = f"figures: {figs.placed - before} not run yet (placeholders), the rest {figs.scale} scale"
    first = [talk.slide_html(talk.title_slide(deck, line), [], "title generated")]
    keys = [k.strip() for k in deck.meta.get("agenda", "").split(",") if k.strip()]
    if keys:
        first += [talk.slide_html(s, [], "generated") for s in
                  talk.agenda_slides(talk.AGENDA.read_text(encoding="utf-8"), keys)]
    sections = first + body
    n_notes = sum('<aside class="notes">' in s for s in sections)
    return talk.page(deck.title, sections), len(sections), n_notes


@dataclass
class Built:
    name: str
    html: Path
    slides: int
    notes: int                 # slides with speaker notes (each adds a page to the PDF)
    content: int
    minutes: int
    pdf: Path | None = None
    pdf_pages: int = -1
    notebooks: list[str] = field(default_factory=list)


def write_whole(path: Path, data: bytes) -> None:
    """Write ``path`` so that a reader sees the old file or the new one, never half of it (the book's build copies
    the decks while a test may be building them)."""
    part = path.with_name(f".{path.name}.part")
    part.write_bytes(data)
    part.replace(path)


def build(names: list[str] | None = None, execute: str = "all", pdf: bool = True, log=print,
          scale: str = "smoke", placeholders: bool = False) -> list[Built]:
    """Build decks (all in slides/talk, or ``names``). ``execute``: ``all`` runs each notebook a deck shows a
    figure of (cached), ``none`` runs nothing (cached runs only; with ``placeholders`` a figure no run made yet
    is a labelled card, else the build fails). ``pdf`` prints each with its notes (needs Chromium)."""
    from contextlib import ExitStack

    from instructor.browser import Chromium, StaticServer, find_chromium

    if execute not in ("all", "none"):
        raise ValueError(f"execute must be 'all' or 'none', got {execute!r}")
    if not (VENDOR / "reveal.js" / "dist" / "reveal.js").exists():
        raise FileNotFoundError(f"{VENDOR}/reveal.js is missing: run 'make setup' (it installs the slide assets with npm)")
    figs = Figures(scale, execute == "all", placeholders)
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    built = []
    for d in talk.load_decks(names):
        t0 = time.perf_counter()
        html, n, n_notes = deck_html(d, figs)
        out = SLIDES / "decks" / f"{d.name}.html"
        out.parent.mkdir(parents=True, exist_ok=True)
        write_whole(out, html.encode("utf-8"))
        built.append(Built(d.name, out, n, n_notes, len(d.content_slides), d.minutes, notebooks=d.notebook_paths()))
        log(f"{d.name}: {n} slides ({len(d.content_slides)} content) in {time.perf_counter() - t0:.1f} s")
    if pdf:
        if not find_chromium():
            raise FileNotFoundError("no Chromium to print the decks: run env/install_chromium.sh (make slides does), "
                                    "or build with --no-pdf")
        (SLIDES / "pdf").mkdir(exist_ok=True)
        with ExitStack() as stack:
            url = stack.enter_context(StaticServer(SLIDES))
            chrome = stack.enter_context(Chromium())
            for b in built:
                b.pdf, part = SLIDES / "pdf" / f"{b.name}.pdf", SLIDES / "pdf" / f".{b.name}.pdf.part"
                b.pdf_pages = chrome.print_pdf(f"{url}/decks/{b.name}.html?showNotes=separate-page", part)
                part.replace(b.pdf)
                log(f"{b.name}: PDF with {b.pdf_pages} pages (slides and their notes)")
                if b.pdf_pages != b.slides + b.notes:
                    raise RuntimeError(f"{b.name}: the PDF has {b.pdf_pages} pages for {b.slides} slides "
                                       f"and {b.notes} pages of notes")
    manifest = SLIDES / "decks" / "manifest.json"
    write_whole(manifest, json.dumps([{"name": b.name, "scale": scale, "slides": b.slides, "content": b.content,
                                       "minutes": b.minutes, "notes": b.notes, "pdf_pages": b.pdf_pages,
                                       "notebooks": b.notebooks} for b in built], indent=1).encode("utf-8"))
    return built


def check_all(log=print) -> int:
    """Print each deck's measures and every rule it breaks; the number of problems."""
    ds = talk.load_decks()
    problems = []
    for d in ds:
        m = talk.measure(d)
        log(f"{d.name:<24} {m.content:>3} content slides  {m.short:>4.0%} <= {talk.MAX_WORDS} words  "
            f"{m.figures:>4.0%} with a figure  {m.notes:>4.0%} with notes  {d.minutes:>3} min")
        problems += talk.check_deck(d, render_diagrams=True)
    agenda = talk.AGENDA.read_text(encoding="utf-8")
    problems += talk.check_agenda(agenda, ds, talk.header_runtimes())
    problems += handson.check_blocks(agenda, handson.load_measurements(), ds)
    for p in problems:
        log("PROBLEM " + p)
    return len(problems)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m instructor.slides")
    p.add_argument("action", choices=["build", "list", "check"])
    p.add_argument("decks", nargs="*")
    p.add_argument("--execute", choices=["all", "none"], default="all",
                   help="run the notebooks the decks take figures from (default), or only use cached runs")
    p.add_argument("--scale", default="smoke", choices=SCALES, help="the scale the notebooks run at for the figures "
                   "(smoke, the default, takes about 10 min; laptop about an hour)")
    p.add_argument("--no-pdf", action="store_true")
    a = p.parse_intermixed_args(argv)   # options may come between the action and the decks
    if a.action == "list":
        for d in talk.load_decks(a.decks or None):
            print(f"{d.name:<24} {d.minutes:>3} min  {len(d.content_slides):>3} slides  {', '.join(d.notebook_paths())}")
        return 0
    if a.action == "check":
        return 1 if check_all() else 0
    t0 = time.perf_counter()
    try:
        build(a.decks or None, execute=a.execute, pdf=not a.no_pdf, scale=a.scale)
    except BuildError as e:
        print(f"build failed: {e}", file=sys.stderr)
        return 1
    print(f"built in {time.perf_counter() - t0:.1f} s -> slides/decks/, slides/pdf/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
