"""The decks, opened in a real headless Chromium from a local server: the instructor's view.

Builds every deck (lecture notebooks executed for their figures; concept and lab notebooks as stored),
prints each to PDF, then checks per deck: reveal.js is ready, the slide count is the one the build
computed, no request left localhost, no console error, every image loaded, the first slide is not blank,
no slide runs past the screen (after the build's layout and the deck's fit), and the PDF has one page per
slide.
"""
import os
import subprocess

import pytest

from instructor import browser, slides

ROOT = slides.ROOT


@pytest.fixture(scope="module")
def built():
    if browser.find_chromium() is None:
        subprocess.run(["bash", str(ROOT / "env" / "install_chromium.sh")], check=False, timeout=600)
    if browser.find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium could not be installed; the browser test must run in CI")
        pytest.skip("no Chromium on this machine (env/install_chromium.sh could not install it)")
    if not (slides.VENDOR / "reveal.js").exists():
        pytest.fail("slides/vendor is missing: 'make setup' installs reveal.js (needs npm)")
    return slides.build(execute="lectures", pdf=True, log=lambda *a: None)


def test_every_module_has_a_deck_from_its_notebooks(built):
    assert [b.name for b in built] == [d.name for d in slides.DECKS]
    for b, d in zip(built, slides.DECKS):
        assert b.sources == [s for s in d.sources if (ROOT / s).exists()]
        assert b.slides >= 1 + len(b.sources), f"{b.name}: {b.slides} slides from {b.sources}"


def test_pdf_has_one_page_per_slide(built):
    for b in built:
        assert b.pdf_pages == b.slides, (b.name, b.pdf_pages, b.slides)


def test_decks_in_a_real_browser(built):
    with browser.StaticServer(slides.SLIDES) as url, browser.Chromium() as chrome:
        for b in built:
            rep = chrome.open(f"{url}/decks/{b.name}.html")
            assert rep.ready, f"{b.name}: reveal.js did not reach the ready state"
            assert rep.total_slides == b.slides, (b.name, rep.total_slides, b.slides)
            assert rep.external_requests == [], f"{b.name} fetched from outside localhost: {rep.external_requests}"
            assert rep.console_errors == [], f"{b.name}: console errors {rep.console_errors[:3]}"
            assert rep.broken_images == 0, f"{b.name}: {rep.broken_images} image(s) did not load"
            assert not browser.png_is_blank(rep.screenshot), f"{b.name}: the first slide is blank"
            assert rep.overflowing == [], f"{b.name}: slides run past the screen: {rep.overflowing[:3]}"
            (slides.SLIDES / "decks" / f"{b.name}.png").write_bytes(rep.screenshot)


def test_lecture_decks_carry_figures_and_notes(built):
    intro = (slides.SLIDES / "decks" / "01_introduction.html").read_text()
    assert intro.count("data:image/png;base64") >= 2
    for b in built:
        assert 'class="notes"' in (slides.SLIDES / "decks" / f"{b.name}.html").read_text(), b.name


def test_blank_detector_and_page_counter_can_fail():
    import io

    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(2, 2))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    assert browser.png_is_blank(buf.getvalue())
    assert browser.pdf_page_count(b"<< /Type /Pages /Count 2 >> << /Type /Page >> << /Type /Page >>") == 2


def test_overflow_detector_can_fail(built):
    """A cell no layout can fit (a 300-line code block) must be reported, not silently cut."""
    import nbformat
    cell = nbformat.v4.new_markdown_cell("## Too long\n\n```\n" + "\n".join(f"line {i}" for i in range(300)) + "\n```")
    cell.metadata["slideshow"] = {"slide_type": "slide"}
    probe = slides.SLIDES / "decks" / "_probe.html"
    try:
        slides.export_html(nbformat.v4.new_notebook(cells=[cell]), probe)
        with browser.StaticServer(slides.SLIDES) as url, browser.Chromium() as chrome:
            rep = chrome.open(f"{url}/decks/_probe.html")
        assert rep.ready and len(rep.overflowing) == 1
        assert float(rep.overflowing[0]["fit"]) == slides.MIN_FIT
    finally:
        probe.unlink(missing_ok=True)
