"""The course's exercises, by topic (the notebook's name without its number), in three places:

* what the learner starts from: the build-it cell of each notebook, and for the longer build-it exercises a file
  of its own, ``exercises/<topic>/<name>.py`` in the checkout, to write in an editor and check from a terminal
  (``python -m ddlcourse check-exercise NAME``);
* the checkers, ``checkers/<topic>.py``: the reference answers of the notebooks' questions (``@exercise``) and a
  checker for each coding exercise (``@code_exercise``) that runs the learner's code on the ranks and names the
  typical mistake it recognises. A checker holds no reference solution;
* the reference solutions, ``solutions/<topic>.py``: what a learner would write (``@reference``), with the typical
  mistakes its checker must name. ``selfcheck.solution(name)`` shows one to a learner who is stuck.

Modules
-------
checkers/   the checkers and the questions' reference answers, one module per notebook topic
solutions/  the reference solutions and the typical mistakes, one module per notebook topic
templates   the learner's starting point: each exercise's template from its notebook, and exercises/<topic>/<name>.py
terminal    ``python -m ddlcourse check-exercise NAME [FILE]``: the same checkers, from a terminal
"""
