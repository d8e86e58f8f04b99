"""The course's exercises, by topic (the notebook's name without its number), in three places:

* what the learner starts from: the build-it cell of each notebook, and for the longer build-it exercises a file
  of its own, ``exercises/<topic>/<name>.py`` in the checkout, to write in an editor and check from a terminal
  (``python -m ddlcourse check-exercise NAME``);
* the checkers, ``checkers/<topic>.py``: the reference answers of the notebooks' questions (``@exercise``) and a
  checker for each coding exercise (``@code_exercise``) that runs the learner's code on the ranks and names the
  typical mistake it recognises. A checker holds no reference solution;
* the reference solutions, ``solutions/<topic>.py``: what a learner would write (``@reference``), with the typical
  mistakes its checker must name. ``selfcheck.solution(name)`` shows one to a learner who is stuck.

A distributed check is first rehearsed: the checker and the learner's code run on simulated ranks whose every
send, receive and collective goes to a referee, which names a deadlock, a message that does not fit its receive,
or an exception on one rank at once, with what each rank was doing, before anything reaches the learner's
cluster (and draws it: ``selfcheck.show_timeline()``).

Modules
-------
checkers/   the checkers and the questions' reference answers, one module per notebook topic
solutions/  the reference solutions and the typical mistakes, one module per notebook topic
templates   the learner's starting point: each exercise's template from its notebook, and exercises/<topic>/<name>.py
terminal    ``python -m ddlcourse check-exercise NAME [FILE]``: the same checkers, from a terminal
rehearsal   a distributed check on simulated ranks first: runs them, names what stopped them, draws the timeline
referee     matches the simulated ranks' sends, receives and collectives; finds deadlocks and mismatched messages
simranks    a simulated rank, started by the rehearsal: puts simmpi and simtorch in place, runs the checker
simworld    what a simulated rank's parts share: its line to the referee, MPI buffers, the learner's source lines
simmpi      the stand-in for mpi4py.MPI on a simulated rank
simtorch    torch.distributed and a pure-Python DistributedDataParallel on a simulated rank
wrong       planted communication mistakes (deadlock, one rank raising, a mismatched message) for every exercise
"""
