"""test_build_it: on every rank, each exercise of the JSON file named in argv[1] (``[[name, learner, script], ...]``)
is checked with its reference (accepted) and the notebook's template (``not written yet``); with argv[2] ==
"mistakes", each registered typical mistake too (named). Rank 0 prints ALL OK, or FAILURES and what failed."""
import json
import sys

from tests.ranks._on_ranks import MPI, RANK, finish, run_checker

from ddlcourse import selfcheck as sc

comm = MPI.COMM_WORLD
with open(sys.argv[1]) as f:
    cases = json.load(f)
with_mistakes = len(sys.argv) > 2 and sys.argv[2] == "mistakes"
failures = []
for name, learner, script in cases:
    ex = sc._code_exercise(name)
    if RANK == 0:
        print("checking", name, flush=True)
    v = run_checker(name, ex.solution)
    if not v.ok:
        failures.append(f"{name}: the reference is rejected: {v.message}")
    for wrong, hint in ex.mistakes if with_mistakes else ():
        v = run_checker(name, wrong)
        if v.ok or hint not in v.message:
            failures.append(f"{name}: mistake {getattr(wrong, '__name__', wrong)!r} gives {v!r}, want {hint!r}")
    ns = {}
    exec(compile(script, "<template>", "exec"), ns)
    v = run_checker(name, ns[learner])
    if v.ok or not v.message.startswith("not written yet"):
        failures.append(f"{name}: the notebook's template gives {v!r}, want 'not written yet'")
    comm.Barrier()
every = comm.gather(failures)
if RANK == 0:
    bad = sorted({f for fs in every for f in fs})
    print("FAILURES" if bad else "ALL OK", *bad, sep="\n")
finish()
