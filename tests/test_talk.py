"""The talk decks (slides/talk/*.md) without a browser: the parser, the rules every deck keeps, the agenda, and the
build's figure handling. Each rule is also shown to fail on a small synthetic deck."""
import base64
import io
import subprocess

import nbformat
import pytest

from instructor import diagrams, slides, talk

DECKS = talk.load_decks()
AGENDA = talk.AGENDA.read_text(encoding="utf-8")


# --------------------------------------------------------------------------- the real decks
@pytest.mark.parametrize("deck", DECKS, ids=[d.name for d in DECKS])
def test_every_deck_keeps_the_rules(deck):
    """Words, figures, notes, slides per hour, code length; every diagram draws, every notebook cell exists."""
    assert talk.check_deck(deck, render_diagrams=True) == []


def test_the_agenda_adds_up_and_matches_the_decks():
    assert talk.check_agenda(AGENDA, DECKS, talk.header_runtimes()) == []


def test_every_deck_a_plan_names_exists_and_every_deck_file_is_presented_or_self_paced():
    plans, _ = talk.parse_agenda(AGENDA)
    planned = {r.deck for p in plans.values() for r in p.rows if r.deck}
    assert planned <= {d.name for d in DECKS}, "a plan names a deck that slides/talk does not have"
    paced = AGENDA.split("## The self-paced path")[1].split("\n## ")[0]
    assert all(d.name in planned or f"`{d.name}`" in paced for d in DECKS)
    assert len(DECKS) == 14


def test_the_deck_list_is_the_deck_files():
    assert [d.name for d in slides.decks()] == sorted(p.stem for p in talk.TALK.glob("*.md"))
    out = subprocess.run([slides.sys.executable, "-m", "instructor.slides", "list"], capture_output=True, text=True,
                         cwd=talk.ROOT, check=True).stdout
    assert [ln.split()[0] for ln in out.splitlines()] == [d.name for d in DECKS]
    assert slides.main(["list", "--no-pdf", DECKS[-1].name]) == 0      # options may sit between action and decks


def test_each_deck_names_notebooks_that_exist():
    for d in DECKS:
        for p in d.notebook_paths():
            assert (talk.ROOT / p).exists(), (d.name, p)


# --------------------------------------------------------------------------- the parser
GOOD = """---
title: A small deck
minutes: 10   # its slot
notebooks: 01, lab 2
---

## The first claim is short
![A ring of four ranks](diagram:ring_allreduce?ranks=4)
- one point with `code that does not count`
- a formula $a + b$ counts once

Note:
The talk track.
Demo: notebook 01.

---

### A section divider

---

## A code slide keeps its fence whole
```python
x = 1
---
Note: this is code, not notes
```

Note:
Notes again.
"""


def test_parser_reads_front_matter_slides_notes_images_and_code():
    d = talk.parse_text(GOOD, "small")
    assert (d.title, d.minutes, d.notebooks) == ("A small deck", 10, ["01", "lab 2"])
    assert d.notebook_paths() == ["notebooks/01_sgd.ipynb", "labs/02_seismic.ipynb"]
    assert [(s.level, s.title) for s in d.slides] == [(2, "The first claim is short"), (3, "A section divider"),
                                                     (2, "A code slide keeps its fence whole")]
    first, _, code = d.slides
    assert first.notes == "The talk track.\nDemo: notebook 01."
    assert [(im.kind, im.target, im.params) for im in first.images] == [("diagram", "ring_allreduce", {"ranks": 4})]
    assert code.code == ["x = 1\n---\nNote: this is code, not notes"] and code.notes == "Notes again."
    assert len(d.content_slides) == 2


def test_words_count_the_body_outside_code_notes_title_and_captions():
    first = talk.parse_text(GOOD, "small").slides[0]
    # "one point with" (3) + "a formula x counts once" (5): the inline code, caption, title and notes do not count
    assert talk.words(first) == 8
    assert talk.words(talk.parse_slide("## T\n```\nmany words in a code block here\n```\n")) == 0


def test_image_references_parse_their_parts():
    im = talk.Image("c", "notebook:notebooks/13_scaling.ipynb#c008")
    assert (im.kind, im.target, im.cell) == ("notebook", "notebooks/13_scaling.ipynb", "c008")
    im = talk.Image("c", "diagram:x?n=3&f=0.5&s=abc")
    assert im.params == {"n": 3, "f": 0.5, "s": "abc"}


def test_a_deck_without_front_matter_is_refused():
    with pytest.raises(ValueError, match="front matter"):
        talk.parse_text("## No front matter\n", "bad")


# --------------------------------------------------------------------------- each rule can fail
def _deck(slides_md: list[str], minutes=30):
    return talk.parse_text(f"---\ntitle: T\nminutes: {minutes}\nnotebooks: 01\n---\n\n" + "\n\n---\n\n".join(slides_md), "syn")


FIG = "![a ring](diagram:ring_allreduce?ranks=2)"


def _slide(title="A claim", words=10, fig=True, notes="Talk track."):
    body = " ".join(["word"] * words)
    return f"## {title}\n{FIG if fig else ''}\n{body}\n" + (f"\nNote:\n{notes}\n" if notes else "")


def test_the_synthetic_deck_passes():
    assert talk.check_deck(_deck([_slide(), _slide(fig=False)]), render_diagrams=True) == []


@pytest.mark.parametrize("case, slides_md, minutes, expect", [
    ("too many words", [_slide(words=41)] + [_slide()] * 5, 30, "keep to 40 words"),
    ("too few figures", [_slide(fig=False), _slide(fig=False), _slide()], 30, "show a figure"),
    ("a slide without notes", [_slide(), _slide(notes="")], 30, "no speaker notes"),
    ("too many slides for the slot", [_slide()] * 6, 10, "per hour"),
    ("an unknown diagram", ["## A claim\n![x](diagram:no_such_diagram)\nNote:\nn"], 30, "no diagram named"),
    ("a diagram that fails to draw", ["## A claim\n![x](diagram:ring_allreduce?colour=3)\nNote:\nn"], 30, "fails"),
    ("an unknown notebook cell", ["## A claim\n![x](notebook:notebooks/01_sgd.ipynb#nope)\nNote:\nn"], 30,
     "no cell with id 'nope'"),
    ("an unknown notebook", ["## A claim\n![x](notebook:notebooks/99_none.ipynb#c1)\nNote:\nn"], 30, "no notebook"),
    ("a long code block", ["## A claim\n" + FIG + "\n```\n" + "x\n" * 13 + "```\nNote:\nn"], 30, "code block of 13"),
    ("a slide without a heading", [FIG + "\nwords\nNote:\nn"], 30, "starts with"),
    ("no minutes", [_slide()], 0, "minutes"),
])
def test_each_rule_fails_on_a_deck_that_breaks_it(case, slides_md, minutes, expect):
    problems = talk.check_deck(_deck(slides_md, minutes), render_diagrams=True)
    assert any(expect in p for p in problems), (case, problems)


def test_section_dividers_need_no_notes_and_do_not_count():
    d = _deck([_slide(), "### Part two", _slide()], minutes=4)    # 2 content slides in 4 min: 30 per hour
    assert talk.check_deck(d) == [] and len(d.content_slides) == 2


# --------------------------------------------------------------------------- the agenda rules can fail
def _agenda(rows_half, runtimes="| notebooks/01_sgd.ipynb | 1 |"):
    head = "| start | minutes | kind | what |\n|---|---|---|---|\n"
    return (f"# Agenda\n\n## Half day (13:00-13:40)\n\n{head}" + "\n".join(rows_half)
            + f"\n\n## Full day (09:00-09:40)\n\n{head}" + "\n".join(rows_half).replace("13:", "09:")
            + "\n\n## What runs live\n\n| notebook | minutes at laptop scale |\n|---|---|\n" + runtimes + "\n")


ROWS = ["| 13:00 | 30 | deck | `syn` a deck |", "| 13:30 | 10 | break | |"]


def test_a_consistent_agenda_passes():
    assert talk.check_agenda(_agenda(ROWS), [_deck([_slide()], 30)], {"notebooks/01_sgd.ipynb": 1}) == []


@pytest.mark.parametrize("case, rows, deck_minutes, runtimes, expect", [
    ("rows do not add up", ROWS[:1] + ["| 13:30 | 5 | break | |"], 30, {"notebooks/01_sgd.ipynb": 1}, "add up to 35"),
    ("a gap between rows", ROWS[:1] + ["| 13:35 | 5 | break | |"], 30, {"notebooks/01_sgd.ipynb": 1}, "starts at 13:35"),
    ("deck minutes differ", ROWS, 25, {"notebooks/01_sgd.ipynb": 1}, "25 in its front matter"),
    ("an unknown deck", ["| 13:00 | 30 | deck | `other` x |", ROWS[1]], 30, {"notebooks/01_sgd.ipynb": 1}, "no deck other"),
    ("a run time that disagrees with the header", ROWS, 30, {"notebooks/01_sgd.ipynb": 3}, "its header says 3"),
])
def test_each_agenda_rule_fails(case, rows, deck_minutes, runtimes, expect):
    problems = talk.check_agenda(_agenda(rows), [_deck([_slide()], deck_minutes)], runtimes)
    assert any(expect in p for p in problems), (case, problems)


def test_a_deck_in_no_plan_must_be_on_the_self_paced_path():
    decks = [_deck([_slide()], 30), talk.parse_text("---\ntitle: U\nminutes: 5\n---\n\n" + _slide(), "unplanned")]
    problems = talk.check_agenda(_agenda(ROWS), decks, None)
    assert any("the decks ['unplanned'] are in no plan and not on the self-paced path" in p for p in problems), problems
    paced = _agenda(ROWS).replace("## What runs live", "## The self-paced path\n\n`unplanned`, at home.\n\n## What runs live")
    assert talk.check_agenda(paced, decks, None) == []


def test_the_run_times_come_from_the_notebook_headers():
    rt = talk.header_runtimes()
    assert rt["notebooks/00_setup_check.ipynb"] >= 1 and "labs/02_seismic.ipynb" in rt
    assert len(rt) == len(list((talk.ROOT / "notebooks").glob("*.ipynb"))) + len(list((talk.ROOT / "labs").glob("*.ipynb")))


# --------------------------------------------------------------------------- diagrams
def test_every_registered_diagram_draws_with_its_defaults():
    for name in sorted(diagrams.DIAGRAMS):
        fig = diagrams.render(name)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=30)
        assert buf.getvalue()[:4] == b"\x89PNG", name


def test_the_ring_schedule_takes_2n_minus_2_steps_and_ends_with_every_sum_everywhere():
    from instructor.diagrams.data_parallel import ring_schedule
    for n in (2, 3, 4, 7):
        states = ring_schedule(n)
        assert len(states) == 1 + 2 * (n - 1)
        after_rs = states[n - 1]
        assert all(len(after_rs[r][(r + 1) % n]) == n for r in range(n))     # rank r owns chunk r+1 after reduce-scatter
        assert all(len(c) == n for row in states[-1] for c in row)


def test_a_diagram_must_return_a_figure_and_names_are_unique():
    with pytest.raises(KeyError, match="no diagram named"):
        diagrams.render("no_such_diagram")
    with pytest.raises(ValueError, match="registered twice"):
        def ring_allreduce():  # noqa: F811 (a second function under a registered name)
            return None
        diagrams.diagram(ring_allreduce)


# --------------------------------------------------------------------------- the build's figures
def _nb_with_outputs():
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    buf = io.BytesIO()
    Figure(figsize=(1, 1)).savefig(buf, format="png")
    png = base64.b64encode(buf.getvalue()).decode()
    with_img = nbformat.v4.new_code_cell("plot()", id="withimg")
    with_img.outputs = [nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"})]
    text_only = nbformat.v4.new_code_cell("print(1)", id="textonly")
    text_only.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    return nbformat.v4.new_notebook(cells=[with_img, text_only]), png


def test_a_notebook_figure_is_the_cells_first_image():
    nb, png = _nb_with_outputs()
    assert slides.cell_image(nb, "withimg") == ("image/png", png)
    assert slides.cell_image(nb, "textonly") is None
    with pytest.raises(KeyError):
        slides.cell_image(nb, "missing")


@pytest.mark.parametrize("cell, expect", [("textonly", "cell 'textonly' of notebooks/01_sgd.ipynb has no image output"),
                                          ("missing", "has no cell with id 'missing'")])
def test_a_missing_figure_fails_the_build_naming_deck_slide_and_cell(cell, expect):
    nb, _ = _nb_with_outputs()
    deck = _deck([f"## The slide's claim\n![x](notebook:notebooks/01_sgd.ipynb#{cell})\nNote:\nn"])
    figs = slides.Figures(execute=True, notebooks={"notebooks/01_sgd.ipynb": nb})
    with pytest.raises(slides.BuildError, match=expect) as e:
        slides.deck_html(deck, figs)
    assert "syn" in str(e.value) and "The slide's claim" in str(e.value)
    ok = _deck(["## Fine\n![x](notebook:notebooks/01_sgd.ipynb#withimg)\nNote:\nn"])
    assert "data:image/png;base64," in slides.deck_html(ok, figs)[0]


def test_placeholders_stand_in_only_when_asked_and_say_so():
    nb, _ = _nb_with_outputs()
    deck = _deck(["## A claim\n![x](notebook:notebooks/01_sgd.ipynb#textonly)\nNote:\nn"])
    figs = slides.Figures(execute=False, placeholders=True, notebooks={"notebooks/01_sgd.ipynb": nb})
    html, n, n_notes = slides.deck_html(deck, figs)
    assert "1 not run yet (placeholders)" in html and (n, n_notes) == (2, 2)


def test_the_title_slide_names_minutes_notebooks_and_scale_and_notes_become_asides():
    figs = slides.Figures(scale="laptop", execute=False)
    html, n, n_notes = slides.deck_html(_deck([_slide(), "### Divider", _slide()], minutes=30), figs)
    assert "figures: laptop scale" in html and "30 minutes" in html and "notebook 01" in html
    assert html.count('<aside class="notes">') == n_notes == 3 and n == 4     # title + 2 content; the divider has none
    assert "../vendor/reveal.js/dist/reveal.js" in html and "http" not in html.split("<body>")[0].replace(
        "http-equiv", "")


def test_the_introduction_carries_the_agenda():
    intro = talk.parse_deck(talk.TALK / "01_introduction.md")
    keys = [k.strip() for k in intro.meta["agenda"].split(",")]
    got = talk.agenda_slides(AGENDA, keys)
    plans, _ = talk.parse_agenda(AGENDA)
    assert len(got) == len(keys) and all(r.start in got[0].body for r in plans[keys[0]].rows)


def test_unknown_scale_is_refused(tmp_path):
    nb = tmp_path / "x.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("a")]), nb)
    with pytest.raises(ValueError, match="scale"):
        slides.executed_copy(nb, execute=True, scale="huge")
    with pytest.raises(SystemExit):
        slides.main(["build", "--scale", "huge"])


def test_make_slides_passes_the_scale():
    dry = subprocess.run(["make", "-n", "slides", "SCALE=laptop"], capture_output=True, text=True,
                         cwd=talk.ROOT, check=True).stdout
    assert "instructor.slides build --scale laptop" in dry, dry
    assert "--scale smoke" in subprocess.run(["make", "-n", "slides"], capture_output=True, text=True,
                                              cwd=talk.ROOT, check=True).stdout


def test_notes_keep_their_cues_apart():
    html = talk.slide_html(talk.parse_slide("## A claim\nbody\nNote:\nThe track.\nDemo: nb 01.\nAsk: why?\nPre-empt: no."), [])
    notes = html.split('<aside class="notes">')[1]
    assert notes.count("<p>") == 4 and "<strong>Demo:</strong>" in notes and "<strong>Pre-empt:</strong>" in notes
