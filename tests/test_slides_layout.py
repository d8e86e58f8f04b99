"""The deck layout rules of instructor.slides, without a browser: splitting, hiding, cutting, paginating."""
import nbformat
import pytest

from instructor import slides


def md(src, kind=None, cid=None):
    c = nbformat.v4.new_markdown_cell(src)
    if kind:
        c.metadata["slideshow"] = {"slide_type": kind}
    if cid:
        c["id"] = cid
    return c


def code(src, outputs=(), kind=None, tags=(), cid=None):
    c = nbformat.v4.new_code_cell(src)
    c.outputs = list(outputs)
    if kind:
        c.metadata["slideshow"] = {"slide_type": kind}
    if tags:
        c.metadata["tags"] = list(tags)
    if cid:
        c["id"] = cid
    return c


def kinds(cells):
    return [slides._slide_type(c) for c in cells]


def test_markdown_splits_at_paragraphs_and_list_items_but_keeps_headings_and_lead_ins_attached():
    src = "## Title\n\nFirst paragraph.\n\nThe steps:\n- one\n- two\n  continued\n\n```\ncode\n\nstill code\n```\n\nLast."
    parts = slides.split_markdown(md(src, "slide"))
    assert [p.source for p in parts] == ["## Title\n\nFirst paragraph.", "The steps:\n\n- one",
                                         "- two\n  continued", "```\ncode\n\nstill code\n```", "Last."]
    assert kinds(parts) == ["slide", "-", "-", "-", "-"]
    # nothing is lost or reordered
    assert "".join(p.source.replace("\n", "") for p in parts) == src.replace("\n", "")


def test_markdown_with_html_or_unbalanced_math_is_left_whole():
    for src in ["<div class='x'>\n\na\n\nb\n\n</div>", "$$\na\n\nb\n$$"]:
        assert len(slides.split_markdown(md(src))) == 1


def test_long_code_hides_its_input_short_code_splits_from_its_result():
    out = nbformat.v4.new_output("stream", name="stdout", text="result\n")
    err = nbformat.v4.new_output("stream", name="stderr", text="  3%|#  | 1/30\n")
    long_src = "\n".join(f"x{i} = {i}" for i in range(slides.CODE_LINES + 1))
    cells = slides.prepare_cells([code(long_src, [out, err]), code("print('result')", [out]),
                                  code(long_src, [out], tags=["slides-code"]),
                                  code("x = 1", [], tags=["slides-no-code"])])
    hidden = [c.metadata.get("transient", {}).get("remove_source", False) for c in cells]
    assert hidden == [True, False, True, False, True]          # long: hidden; short: input | result; tagged: shown
    assert [len(c.outputs) for c in cells] == [1, 0, 1, 0, 1]  # stderr (progress bars) dropped
    assert cells[3].source == long_src


def test_long_printed_output_is_cut_and_says_so():
    text = "".join(f"line {i}\n" for i in range(100))
    (o,) = slides.slide_outputs([nbformat.v4.new_output("stream", name="stdout", text=text)])
    lines = o["text"].rstrip("\n").split("\n")
    assert len(lines) == slides.OUTPUT_LINES + 1 and lines[-1].startswith(f"... ({100 - slides.OUTPUT_LINES} more")


def test_paginate_starts_a_continued_subslide_where_a_slide_would_overflow():
    cells = [md("## Section", "slide", "a"), md("para", None, "b"), md("para", None, "c"),
             md("### Sub", None, "d"), md("para", None, "e"), md("## Next", "slide", "f")]
    heights = {"a": 100, "b": 300, "c": 300, "d": 350, "e": 300, "f": 100, "_cont": 50}
    out = slides.paginate(cells, heights, budget=650)
    assert [(slides._slide_type(c) or "-", c.source) for c in out] == [
        ("slide", "## Section"), ("-", "para"),
        ("subslide", "### Section (continued)"), ("-", "para"),       # 100+300+300 > 650
        ("subslide", "### Sub"), ("-", "para"),                       # a heading opens its own subslide
        ("slide", "## Next")]
    # every slide's cells fit in the budget
    used = 0
    for c in out:
        if slides._slide_type(c) in ("slide", "subslide"):
            used = 0
        used += heights.get(c.get("id"), heights["_cont"])
        assert used <= 650
    assert slides.count_slides(nbformat.v4.new_notebook(cells=out)) == 4


def test_paginate_leaves_a_deck_that_fits_alone():
    cells = [md("## A", "slide", "a"), code("x", [], None, cid="b"), md("## B", "slide", "c")]
    out = slides.paginate(cells, {"a": 10, "b": 10, "c": 10}, budget=600)
    assert [c.source for c in out] == [c.source for c in cells] and kinds(out) == kinds(cells)


def test_unknown_scale_is_refused(tmp_path):
    nb = tmp_path / "x.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[md("a")]), nb)
    with pytest.raises(ValueError, match="scale"):
        slides.executed_copy(nb, execute=True, scale="huge")


def test_make_slides_passes_the_scale_and_the_deck_says_which():
    """`make slides SCALE=laptop` builds reference decks from laptop-scale runs; their title slide says so."""
    import subprocess

    dry = subprocess.run(["make", "-n", "slides", "SCALE=laptop"], capture_output=True, text=True,
                         cwd=slides.ROOT, check=True).stdout
    assert "instructor.slides build --scale laptop" in dry, dry
    assert "--scale smoke" in subprocess.run(["make", "-n", "slides"], capture_output=True, text=True,
                                              cwd=slides.ROOT, check=True).stdout
    head = slides.title_cells(slides.DECKS[0], "laptop")[0].source
    assert "runs at the `laptop` scale" in head
    with pytest.raises(SystemExit):
        slides.main(["build", "--scale", "huge"])
