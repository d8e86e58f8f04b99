"""The instructor's tools, outside the learners' package ``ddlcourse``: the slide builder (``instructor.slides``,
``make slides``), headless Chromium for printing and testing the decks (``instructor.browser``), and the figures
drawn for the lecture-only slides (``instructor.figures``). Run from the repository root:
``python -m instructor.slides build``."""
