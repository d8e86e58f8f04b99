"""The course as a book (instructor/book.py, ``make book``), built and opened in a real headless Chromium.

The build here runs no notebook: it shows the runs slides/build/executed holds at the test's scale (``make book
SCALE=smoke`` leaves one of every notebook and lab, and CI runs it before ``make test``) and the decks slides/
holds, into book/_build/test (``make book``'s own site stays as it is). Every page is opened once from a local
server: it loads with no request leaving localhost and no console error, says the scale its outputs come from, every
image loads and a notebook's page has an image for each figure of its run, no internal link is broken, and no page
shows three consecutive lines of a reference solution. Search finds a notebook, and the decks open from the book.
"""
import base64
import html
import inspect
import json
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest

from ddlcourse import selfcheck as sc
from helpers import need_chromium, solution_lines, text_shows
from instructor import book, browser, slides

SCALE = os.environ.get("DDLCOURSE_SCALE", "smoke")
OUT = book.OUT / "test"
SCREENSHOTS = OUT / "screenshots"
IMAGES = ("image/png", "image/jpeg", "image/svg+xml")


# --------------------------------------------------------------------------- the sources, without a browser
def test_every_notebook_and_lab_is_a_chapter_in_the_course_order():
    chs = book.chapters()
    assert [c.path.as_posix() for c in chs] == sorted(p.relative_to(book.ROOT).as_posix() for p in
                                                      (book.ROOT / "notebooks").glob("*.ipynb")) + sorted(
        p.relative_to(book.ROOT).as_posix() for p in (book.ROOT / "labs").glob("*.ipynb"))
    assert list(book.parts(chs)) == [f"Part {i} · {name}" for i, name in enumerate(
        ["Foundations", "Data parallelism", "Beyond one device's memory", "Transformer-era parallelism",
         "Running at scale"], 1)] + [book.LABS]


def test_references_to_notebooks_and_labs_become_links():
    chs = {c.ref: c for c in book.chapters()}
    here = chs[("notebook", "05")]
    text = ("Assumes notebook 04 (allreduce) and notebooks 02, 03 and 16; lab 2 trains it. "
            "Not `notebook 04`, $notebook 04$, [notebook 04](x.ipynb), notebook 99 or this notebook 05.")
    assert book.link_references(text, here, chs) == (
        "Assumes [notebook 04](04_collectives.ipynb) (allreduce) and notebooks [02](02_batch_size.ipynb), "
        "[03](03_loss_integrity.ipynb) and [16](16_pipeline.ipynb); [lab 2](../labs/02_seismic.ipynb) trains it. "
        "Not `notebook 04`, $notebook 04$, [notebook 04](x.ipynb), notebook 99 or this notebook 05.")


def test_exercises_page_has_every_exercise_and_its_hints_and_no_solution():
    page = book.exercises_page(book.chapters())
    sc._load_all()
    for name, ex in sc.CODE_EXERCISES.items():
        if book._topic(ex.checker) is None:
            continue                    # planted by another test in this process, not the course's
        assert f"Build it: `{name}`" in page, name
        assert ex.mistakes, f"{name}: no typical mistake registered, so no hint to list"
        for hint in book.hints(ex):
            assert book._plain(hint) in page, (name, hint)
    for name, (fn, hint) in sc.EXERCISES.items():
        if book._topic(fn) is None:
            continue
        assert f"- `{name}`: {book._plain(hint)}" in page, name
    sc._load_all(sc.SOLUTIONS_PACKAGE)
    shown = {n: text_shows(page, solution_lines(fn)) for n, (fn, _) in sc.SOLUTIONS.items()}
    assert {n: s for n, s in shown.items() if s} == {}


def _planted_checker(fn):
    return True


def test_an_exercise_a_test_registers_is_not_the_courses(monkeypatch):
    """In one test process other tests register exercises of their own (their checkers live in test modules): the
    page lists the course's only, and builds."""
    sc._load_all()
    monkeypatch.setitem(sc.CODE_EXERCISES, "planted_here", sc.CodeExercise("planted_here", _planted_checker, False,
                                                                          ranks=()))
    monkeypatch.setitem(sc.EXERCISES, "planted_question", (_planted_checker, "a planted hint"))
    page = book.exercises_page(book.chapters())
    assert "planted_here" not in page and "planted_question" not in page
    assert "Build it: `ring_allreduce`" in page


def test_a_hint_is_the_checkers_whole_message():
    """A registered hint cut short ("... after bac") is shown as the message the checker prints."""
    sc._load_all()
    registered = [h for _, h in sc.CODE_EXERCISES["stage_send_recv"].mistakes]
    shown = book.hints(sc.CODE_EXERCISES["stage_send_recv"])
    assert len(shown) == len(registered)
    assert all(s.startswith(r) for s, r in zip(shown, registered))
    assert any(len(s) > len(r) + 20 for s, r in zip(shown, registered))


# --------------------------------------------------------------------------- the site in a browser
@pytest.fixture(scope="module")
def site():
    need_chromium()
    if not (slides.VENDOR / "katex").exists():
        pytest.fail("slides/vendor is missing: 'make setup' installs KaTeX and reveal.js (needs npm)")
    return book.build(SCALE, execute="none", decks="copy", out=OUT, log=lambda *a: None)


# what the tests read of each page, in one evaluation: its text, its links, the figures of its notebook cells, the
# line at its top, and the math KaTeX did not render
PAGE = """JSON.stringify({
  text: document.body.innerText,
  links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
  figures: document.querySelectorAll('.cell_output img').length,
  banner: (document.querySelector('.bd-header-announcement') || {}).innerText || '',
  unrendered_math: Array.from(document.querySelectorAll('.math')).filter(m => !m.querySelector('.katex')).length
    + document.querySelectorAll('.katex-error').length,
})"""
SHOTS = {"part1.html": "document.body", "notebooks/13_scaling.html": "document.querySelector('.cell_output img')",
         "exercises.html": "document.body"}     # the report's screenshots, scrolled to that element


@pytest.fixture(scope="module")
def visited(site):
    """Every page of the site, opened once: its path -> what PAGE reads, and its PageReport as "report"."""
    out = {}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with browser.StaticServer(site.html) as url, browser.Chromium(width=1280, height=900) as chrome:
        for page in book.pages(site.html):
            rel = page.relative_to(site.html).as_posix()
            rep = chrome.visit(f"{url}/{rel}")
            out[rel] = dict(json.loads(chrome.eval(PAGE)), report=rep)
            if rel in SHOTS:
                chrome.eval(f"({SHOTS[rel]} || document.body).scrollIntoView()")
                shot = chrome.send("Page.captureScreenshot", format="png")["data"]
                (SCREENSHOTS / rel.replace("/", "_").replace(".html", ".png")).write_bytes(base64.b64decode(shot))
        yield url, chrome, out


def test_every_page_loads_offline_and_says_the_scale(site, visited):
    url, _, pages = visited
    assert len(pages) == site.pages >= len(book.chapters()) + 8
    for rel, page in pages.items():
        rep = page["report"]
        assert rep.ready, f"{rel} did not load"
        assert rep.external_requests == [], f"{rel} fetched from outside localhost: {rep.external_requests}"
        errors = [e for e in rep.console_errors if "favicon.ico" not in e]   # the browser asks for one itself
        assert errors == [], f"{rel}: console errors {errors[:3]}"
        assert rep.broken_images == 0, f"{rel}: {rep.broken_images} image(s) did not load"
        assert f"{SCALE} scale" in page["banner"], f"{rel} does not say the scale of its outputs: {page['banner']!r}"
        assert page["unrendered_math"] == 0, f"{rel}: {page['unrendered_math']} formulas KaTeX did not render"


def test_in_ci_every_page_shows_its_run(site):
    """CI builds the book before the tests (.ci/run): its browser test sees every notebook run, with its figures."""
    if not os.environ.get("CI"):
        pytest.skip("outside CI a notebook may have no run at this scale yet")
    assert site.not_run == [], f"no run at the {SCALE} scale of {site.not_run}: .ci/run builds the book first"


def test_every_figure_of_a_run_is_an_image_that_loads(site, visited):
    _, _, pages = visited
    for ch in book.chapters():
        nb = nbformat.read(OUT / "src" / ch.path, as_version=4)
        figures = sum(any(m in o.get("data", {}) for m in IMAGES) for c in nb.cells if c.cell_type == "code"
                      for o in c.outputs)
        page = pages[ch.path.with_suffix(".html").as_posix()]
        assert page["figures"] == figures, f"{ch.path}: the run has {figures} figures, its page shows {page['figures']}"
        if ch.path.as_posix() not in site.not_run:
            assert f"a run at the {SCALE} scale" in page["text"], f"{ch.path}: the page does not name its run"


def broken_links(links: list[str], url: str, root: Path) -> list[str]:
    """The links to ``url`` (the site's server) whose file is not under ``root``, or whose page has no such anchor."""
    broken = []
    for link in links:
        if not link.startswith(url + "/"):
            continue
        u = urlparse(link)
        target = root / unquote(u.path).lstrip("/")
        target = target / "index.html" if target.is_dir() else target
        if not target.is_file():
            broken.append(link)
        elif u.fragment and target.suffix == ".html" and f'id="{unquote(u.fragment)}"' not in target.read_text():
            broken.append(f"{link} (no such anchor)")
    return broken


def test_no_internal_link_is_broken(site, visited):
    url, _, pages = visited
    broken = {rel: broken_links(page["links"], url, site.html) for rel, page in pages.items()}
    assert {rel: b for rel, b in broken.items() if b} == {}
    assert sum(len(page["links"]) for page in pages.values()) > 20 * len(pages)     # the contents beside each page


def test_the_link_checker_can_fail(site, visited):
    url, chrome, _ = visited
    probe = site.html / "_probe.html"
    try:
        probe.write_text('<a href="index.html">ok</a> <a href="nowhere.html">1</a> <a href="index.html#nowhere">2</a>')
        chrome.visit(f"{url}/_probe.html")
        links = json.loads(chrome.eval(PAGE))["links"]
        assert broken_links(links, url, site.html) == [f"{url}/nowhere.html",
                                                       f"{url}/index.html#nowhere (no such anchor)"]
    finally:
        probe.unlink(missing_ok=True)


def test_notebooks_link_each_other(visited):
    url, _, pages = visited
    links = pages["notebooks/05_data_parallel.html"]["links"]
    assert f"{url}/notebooks/04_collectives.html" in links          # "notebook 04" in its text
    assert f"{url}/notebooks/06_data_parallel_in_practice.html" in links   # the next page


def solution_texts() -> dict:
    sc._load_all(sc.SOLUTIONS_PACKAGE)
    return {name: solution_lines(fn) for name, (fn, _) in sc.SOLUTIONS.items()}


def test_no_page_shows_a_solution(visited):
    _, _, pages = visited
    refs = solution_texts()
    shown = [(rel, name) for rel, page in pages.items() for name, lines in refs.items()
             if text_shows(page["text"], lines)]
    assert shown == []


def test_the_solution_detector_can_fail(site, visited):
    """A page that shows a reference solution's source is caught."""
    url, chrome, _ = visited
    sc._load_all(sc.SOLUTIONS_PACKAGE)
    fn = sc.SOLUTIONS["ring_allreduce"][0]
    probe = site.html / "_probe.html"
    try:
        probe.write_text(f"<html><body><pre>{html.escape(inspect.getsource(fn))}</pre></body></html>")
        chrome.visit(f"{url}/_probe.html")
        assert text_shows(chrome.eval("document.body.innerText"), solution_lines(fn))
    finally:
        probe.unlink(missing_ok=True)


def test_search_finds_a_notebook(visited):
    url, chrome, _ = visited
    chrome.visit(f"{url}/search.html?q=allreduce")
    found = []
    for _ in range(50):      # the index loads, then the results appear
        found = chrome.eval("Array.from(document.querySelectorAll('#search-results a')).map(a => a.href)") or []
        if found:
            break
        chrome.eval("new Promise(r => setTimeout(r, 200))")
    assert f"{url}/notebooks/04_collectives.html" in [f.split("?")[0].split("#")[0] for f in found], found[:5]


def test_every_deck_in_the_book_is_linked_and_opens_offline(site, visited):
    url, chrome, pages = visited
    decks = {link for page in pages.values() for link in page["links"] if "/slides/decks/" in link}
    assert {Path(urlparse(d).path).stem for d in decks} == set(site.decks)
    for deck in sorted(decks):
        rep = chrome.open(deck)
        assert rep.ready, f"{deck}: reveal.js did not start"
        assert rep.external_requests == [] and rep.broken_images == 0, deck
