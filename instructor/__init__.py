"""The instructor's tools, outside the learners' package ``ddlcourse``: the talk decks' parser and rules
(``instructor.talk``), their build (``instructor.slides``, ``make slides``), the diagrams drawn for them
(``instructor.diagrams``), and headless Chromium for printing and testing them (``instructor.browser``). Run from
the repository root: ``python -m instructor.slides build``."""
