"""A distributed mistake teaches in seconds, and the learner's cluster survives it (issue 44).

For every distributed build-it exercise, on one cluster that no test restarts by hand, as a learner would submit
them from a notebook with ``selfcheck.check_code``: a deadlock, an exception on one rank, a message whose size or
dtype does not fit its receive (each planted by :mod:`ddlcourse.exercises.wrong` with the exercise's own means of
communication), then the reference. Each wrong answer must get a verdict that says what happened within
``LIMIT_S`` (the check's own limit, passed to it: a check that hangs past it says so instead, and fails here),
and the reference must then pass on the same engines.

Then the cases the rehearsal cannot see, because they happen on the real ranks only: a rank that hangs, and an
engine that dies. The check says so, replaces the engines in one line, and the next check passes.
"""
from __future__ import annotations

import contextlib

import pytest

from ddlcourse import cluster as clusters_
from ddlcourse import selfcheck as sc
from ddlcourse.exercises import wrong

LIMIT_S = 60.0                 # each check's limit, rehearsal and real run: a hang cannot pass for a verdict
NAMES = wrong.distributed_exercises()


@pytest.fixture(scope="module")
def cluster_of():
    """``cluster_of(n)``: this module's cluster of ``n`` engines, started once, stopped at the end."""
    made: dict = {}
    with contextlib.ExitStack() as stack:
        def get(n: int):
            if n not in made:
                made[n] = stack.enter_context(clusters_.MPICluster(n=n, quiet=True))
            return made[n]
        yield get


def _ranks(name: str) -> int:
    ranks = sc._code_exercise(name).ranks
    return 2 if 2 in ranks else max(ranks)


def test_every_distributed_exercise_is_covered():
    assert len(NAMES) >= 25, NAMES
    for name in NAMES:
        for kind in wrong.KINDS:
            assert callable(wrong.planted(name, kind))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_each_wrong_submission_is_named_then_the_reference_passes(name, cluster_of, capsys):
    c = cluster_of(_ranks(name))
    engines = list(c.ranks)
    for kind in wrong.KINDS:
        ok = sc.check_code(name, wrong.planted(name, kind), cluster=c, timeout=LIMIT_S)
        said = capsys.readouterr().out
        assert not ok, f"{name}: the planted {kind} passed: {said}"
        assert wrong.named(kind, said), f"{name}: the verdict on the planted {kind} does not say what happened:\n{said}"
        assert "replaced" not in said, f"{name}: a {kind} reached the real ranks:\n{said}"
    assert sc.check_code(name, sc._code_exercise(name).solution, cluster=c, timeout=LIMIT_S), capsys.readouterr().out
    assert c.ranks == engines, "the engines were replaced: a wrong submission reached them"


# ----------------------------------------------------------------------------- what only the real ranks show
def _real_only(kind: str):
    """The ring's reference, with a fault that only a real rank makes (the rehearsal's ranks pass): rank 1 hangs,
    or its process dies."""
    ref = sc._code_exercise("ring_allreduce").solution

    def ring(buf, comm):
        import os
        import time

        from ddlcourse.exercises import rehearsal
        if rehearsal.calls() is None and comm.Get_rank() == 1:
            if kind == "hang":
                time.sleep(3600)
            os._exit(3)
        return ref(buf, comm)
    return ring


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hang", "dies"])
def test_a_fault_on_the_real_ranks_is_reported_and_the_engines_replaced(kind, cluster_of, capsys):
    c = cluster_of(2)
    before = list(c.ranks)
    assert not sc.check_code("ring_allreduce", _real_only(kind), cluster=c, timeout=15)
    said = capsys.readouterr().out
    lines = [line for line in said.splitlines() if line.startswith("[ring_allreduce]")]
    assert len(lines) == 2, said                                     # the verdict, and the one line on the engines
    if kind == "hang":
        assert "gave no answer within 15 s" in lines[0], said
    else:
        assert "did not finish on the real ranks" in lines[0], said
    assert "engines were replaced" in lines[1], said
    assert c.ranks != before
    assert sc.check_code("ring_allreduce", sc._code_exercise("ring_allreduce").solution, cluster=c), \
        capsys.readouterr().out
