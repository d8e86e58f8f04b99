"""The scripts that the tests run on MPI ranks (or in a process of their own), one module per script.

``helpers.run_ranks(n, "collectives_allreduce", *args)`` runs ``tests/ranks/collectives_allreduce.py`` as
``python -m tests.ranks.collectives_allreduce ARGS`` on ``n`` ranks, from the repository root; a script reads its
parameters from ``sys.argv[1:]`` (structured ones as JSON). ``helpers.module_command(name, *args)`` is the same
command line for a plain subprocess. A module is named after the test module that runs it (without ``test_``,
so that pytest does not collect it) and what it checks; a name that starts with ``_`` is shared by scripts
(``_on_ranks``: what every exercise check on ranks starts and ends with). This package imports nothing: a script
that must start without the course's package (test_imports) starts so.
"""
