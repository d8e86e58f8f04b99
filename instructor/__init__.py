"""The instructor's tools, outside the learners' package ``ddlcourse``: the talk decks' parser and rules
(``instructor.talk``), their build (``instructor.slides``, ``make slides``), the diagrams drawn for them
(``instructor.diagrams``), headless Chromium for printing and testing them (``instructor.browser``), the agenda's
hands-on blocks and the measurements their minutes come from (``instructor.handson``), the guide to each block
(``instructor.guides``), and the course as a static site (``instructor.book``, ``make book``). Run from the
repository root: ``python -m instructor.slides build``."""
