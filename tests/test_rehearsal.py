"""The rehearsal of a distributed check (ddlcourse/exercises/rehearsal.py, referee.py, simranks.py and its parts):
the referee matches calls as MPI would and names what cannot match; a rehearsal on simulated ranks says what each
rank was doing and draws it; nothing of it runs on a real rank.

The referee is tested on its own with hand-made calls, then a few whole rehearsals: a ring whose ranks all
receive first on 3 ranks (the deadlock a learner meets most), a message into a receive buffer too small, an
exception on one rank, and a checker that reads the learner's calls.
"""
from __future__ import annotations

import numpy as np
import pytest

from ddlcourse import selfcheck as sc
from ddlcourse.exercises import rehearsal
from ddlcourse.exercises.referee import Problem, Referee


def _send(ref, rank, peer, count=4, dtype="float64", ctx="m0", tag=0, name="Send"):
    return ref.post(rank, dict(kind="send", name=name, ctx=ctx, peer=peer, tag=tag, count=count, dtype=dtype,
                               payload=np.zeros(count, dtype=dtype)))


def _recv(ref, rank, peer, count=4, dtype="float64", ctx="m0", tag=0, name="Recv"):
    return ref.post(rank, dict(kind="recv", name=name, ctx=ctx, peer=peer, tag=tag, count=count, dtype=dtype))


def _coll(ref, rank, name, count=4, dtype="float64", ctx="m0", **args):
    payload = np.full(count, rank + 1, dtype=dtype) if dtype else None
    return ref.post(rank, dict(kind="coll", name=name, ctx=ctx, count=count, dtype=dtype, payload=payload, args=args))


# ----------------------------------------------------------------------------- the referee alone
def test_a_message_meets_its_receive_in_either_order_and_messages_do_not_overtake():
    ref = Referee(2)
    first, second = _send(ref, 0, 1, tag=5), _send(ref, 0, 1, tag=5, count=2)
    assert not first.done                                   # a send waits for its receive (strict matching)
    r1 = _recv(ref, 1, 0, tag=5)
    assert first.done and r1.done and r1.result["count"] == 4
    r2 = _recv(ref, 1, -1, tag=-1)                          # ANY_SOURCE, ANY_TAG: the next message in order
    assert second.done and r2.result["count"] == 2 and r2.result["source"] == 0


def test_a_message_larger_than_its_receive_is_truncation_naming_both_ranks():
    ref = Referee(2)
    _send(ref, 1, 0, count=5, dtype="float32")
    with pytest.raises(Problem) as e:
        _recv(ref, 0, 1, count=4, dtype="float32")
    assert e.value.kind == "truncated"
    assert "rank 1 sends 5 float32 to rank 0" in e.value.message and "holds 4" in e.value.message


def test_another_dtype_is_named_with_both_sizes_in_bytes():
    ref = Referee(2)
    _send(ref, 0, 1, count=4, dtype="float32")
    with pytest.raises(Problem) as e:
        _recv(ref, 1, 0, count=4, dtype="float64")
    assert e.value.kind == "mismatch" and "4 float32 (16 bytes)" in e.value.message and "(32 bytes)" in e.value.message


def test_collectives_match_in_order_and_a_disagreement_is_named():
    ref = Referee(3)
    ops = [_coll(ref, r, "Allreduce", op="SUM") for r in range(3)]
    assert all(o.done for o in ops)
    assert np.array_equal(ops[0].result, np.full(4, 6.0))   # 1 + 2 + 3
    _coll(ref, 0, "Allreduce", count=3, op="SUM")
    _coll(ref, 1, "Allreduce", count=4, op="SUM")
    with pytest.raises(Problem) as e:
        _coll(ref, 2, "Allreduce", count=4, op="SUM")
    assert e.value.kind == "collective" and "different sizes or dtypes" in e.value.message
    ref = Referee(2)
    _coll(ref, 0, "Barrier", count=0, dtype="")
    with pytest.raises(Problem) as e:
        _coll(ref, 1, "Bcast", root=0)
    assert "called different collectives" in e.value.message


def test_a_deadlock_lists_what_each_rank_waits_for():
    ref = Referee(3)
    waits = {r: [_recv(ref, r, (r - 1) % 3)] for r in range(3)}
    p = ref.deadlock(waits, {})
    assert p.kind == "deadlock" and len(p.ops) == 3
    for r in range(3):
        assert f"rank {r} waits in Recv from rank {(r - 1) % 3}" in p.message


# ----------------------------------------------------------------------------- whole rehearsals
def _ring_receive_first(buf, comm):
    """Every rank receives its neighbour's chunk before it sends its own: the ring deadlocks."""
    r, n = comm.Get_rank(), comm.Get_size()
    chunks = np.array_split(buf.reshape(-1), n)
    tmp = np.empty(len(chunks[0]), dtype=buf.dtype)
    for s in range(n - 1):
        comm.Recv(tmp[:len(chunks[(r - s - 1) % n])], source=(r - 1) % n)
        comm.Send(chunks[(r - s) % n], dest=(r + 1) % n)
    return buf


def test_a_ring_that_receives_first_is_a_deadlock_named_on_three_ranks():
    verdicts, r = sc.rehearse("ring_allreduce", _ring_receive_first, 3)
    assert r.problem is not None and r.problem.kind == "deadlock"
    said = verdicts[0].message
    assert said.startswith("deadlock: every rank that has not finished waits for another")
    for k in range(3):
        assert f"rank {k} waits in Recv from rank {(k - 1) % 3}" in said, said
    assert "Every rank waits to receive, and none sends" in said
    assert "comm.Recv(tmp[:len(chunks[(r - s - 1) % n])], source=(r - 1) % n)" in said   # the learner's line
    assert "nothing ran on your cluster" in said


def test_the_timeline_draws_each_rank_and_marks_the_waiting_calls(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    _, r = sc.rehearse("ring_allreduce", _ring_receive_first, 3)
    fig = r.timeline(learner_only=True)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1", "rank 2"]
    assert "deadlock" in ax.get_title()
    waiting = rehearsal.pending(r)
    assert {o.rank for o in waiting if o.learner} == {0, 1, 2}
    fig.savefig(tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 1000


def test_an_exception_on_one_rank_is_named_with_its_line_while_the_others_wait():
    def ring(buf, comm):
        if comm.Get_rank() == 2:
            raise ValueError("chunk sizes do not add up")
        return sc._code_exercise("ring_allreduce").solution(buf, comm)

    verdicts, r = sc.rehearse("ring_allreduce", ring, 3)
    said = verdicts[0].message
    assert said.startswith("rank 2 raised ValueError: chunk sizes do not add up"), said
    assert 'raise ValueError("chunk sizes do not add up")' in said
    assert "the other ranks wait for it for ever" in said


def test_a_ring_made_of_mpi_allreduce_is_right_in_numbers_and_still_rejected():
    from mpi4py import MPI    # only the constants: the rehearsal's ranks get their own MPI

    def lazy(buf, comm):
        comm.Allreduce(MPI.IN_PLACE, buf)
        return buf

    verdicts, r = sc.rehearse("ring_allreduce", lazy, 2)
    assert r.finished_cleanly and not r.ok
    assert "a ring allreduce is made of point-to-point messages only" in verdicts[0].message


def test_calls_are_seen_on_simulated_ranks_only():
    assert rehearsal.calls() is None
