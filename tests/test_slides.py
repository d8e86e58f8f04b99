"""The talk decks, built once and opened in a real headless Chromium from a local server: the instructor's view.

The build (``instructor.slides.build``) runs no notebook here: it uses the executed copies a ``make slides`` left in
slides/build/executed, and a labelled placeholder for a figure no run has made yet, so the test stays quick; the
figure rules themselves (a missing cell or image fails the build) are tested in tests/test_talk.py. Per deck:
reveal.js is ready, the slide count is the build's, no request leaves localhost, no console error, every image
loads, the first slide is not blank, no slide overflows the 1280x720 frame, and, measured on the rendered DOM, the
rules of the decks: at least 90% of content slides keep to 40 words, at least half show a figure, every content
slide has speaker notes, at most 30 content slides per hour of the deck's slot. The PDF handout has a page per
slide and a page of notes after each slide that has notes.
"""
import json

import pytest

from helpers import need_chromium
from instructor import browser, slides, talk

ROOT = slides.ROOT


@pytest.fixture(scope="module")
def built():
    need_chromium()
    if not (slides.VENDOR / "reveal.js").exists():
        pytest.fail("slides/vendor is missing: 'make setup' installs reveal.js (needs npm)")
    return slides.build(execute="none", placeholders=True, pdf=True, log=lambda *a: None)


@pytest.fixture(scope="module")
def chrome():
    with browser.StaticServer(slides.SLIDES) as url, browser.Chromium() as c:
        c.base = url
        yield c


def measures(chrome) -> list[dict]:
    return json.loads(chrome.eval("JSON.stringify(ddlMeasures())"))


def test_every_deck_file_is_built(built):
    assert [b.name for b in built] == [p.stem for p in talk.deck_files()]
    assert len(built) == 14, "the course has 14 decks (slides/AGENDA.md)"


def test_pdf_handout_has_each_slide_and_its_notes(built):
    for b in built:
        assert b.pdf_pages == b.slides + b.notes, (b.name, b.pdf_pages, b.slides, b.notes)
        assert b.notes >= b.content, f"{b.name}: {b.notes} slides with notes for {b.content} content slides"


def test_decks_in_a_real_browser(built, chrome):
    for b in built:
        rep = chrome.open(f"{chrome.base}/decks/{b.name}.html")
        assert rep.ready, f"{b.name}: reveal.js did not reach the ready state"
        assert rep.total_slides == b.slides, (b.name, rep.total_slides, b.slides)
        assert rep.external_requests == [], f"{b.name} fetched from outside localhost: {rep.external_requests}"
        assert rep.console_errors == [], f"{b.name}: console errors {rep.console_errors[:3]}"
        assert rep.broken_images == 0, f"{b.name}: {rep.broken_images} image(s) did not load"
        assert not browser.png_is_blank(rep.screenshot), f"{b.name}: the first slide is blank"
        assert rep.overflowing == [], f"{b.name}: slides overflow the 1280x720 frame: {rep.overflowing[:3]}"
        assert chrome.eval("!!(Reveal.hasPlugin && Reveal.hasPlugin('notes'))"), f"{b.name}: no speaker view"
        (slides.SLIDES / "decks" / f"{b.name}.png").write_bytes(rep.screenshot)


def test_the_rendered_decks_keep_the_rules(built, chrome):
    for b in built:
        chrome.open(f"{chrome.base}/decks/{b.name}.html")
        m = measures(chrome)
        content = [s for s in m if s["kind"] == "content" and not s["generated"]]
        assert m[0]["kind"] == "title" and "scale" in chrome.eval(
            "document.querySelector('.reveal .slides section').textContent"), b.name
        assert len(content) == b.content, (b.name, len(content), b.content)
        short = sum(s["words"] <= talk.MAX_WORDS for s in content) / len(content)
        assert short >= talk.SHARE_SHORT, (b.name, [(s["title"], s["words"]) for s in content if s["words"] > 40])
        assert sum(s["figures"] > 0 for s in content) / len(content) >= talk.SHARE_FIGURES, b.name
        assert all(s["notes"] > 0 for s in content), (b.name, [s["title"] for s in content if not s["notes"]])
        assert 60 * len(content) / b.minutes <= talk.SLIDES_PER_HOUR, (b.name, len(content), b.minutes)


def test_the_browser_measures_can_fail(built, chrome):
    """A wordy slide without figure or notes, and a 300-line code block no fit can save, are reported."""
    wordy = talk.parse_slide("## A wordy slide\n" + " ".join(["word"] * 60))
    tall = talk.parse_slide("## Too long\n```\n" + "\n".join(f"line {i}" for i in range(300)) + "\n```\nNote:\nn")
    probe = slides.SLIDES / "decks" / "_probe.html"
    try:
        probe.write_text(talk.page("probe", [talk.slide_html(wordy, []), talk.slide_html(tall, [])]))
        rep = chrome.open(f"{chrome.base}/decks/_probe.html")
        m = measures(chrome)
        assert rep.ready and [(s["words"], s["figures"], s["notes"] > 0) for s in m] == [(60, 0, False), (0, 0, True)]
        assert [o["title"] for o in rep.overflowing] == ["Too long"]
        assert float(rep.overflowing[0]["fit"]) == pytest.approx(0.7)
    finally:
        probe.unlink(missing_ok=True)


def test_blank_detector_and_page_counter_can_fail():
    import io

    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(2, 2))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    assert browser.png_is_blank(buf.getvalue())
    assert browser.pdf_page_count(b"<< /Type /Pages /Count 2 >> << /Type /Page >> << /Type /Page >>") == 2
