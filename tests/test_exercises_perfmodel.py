"""The coding exercise of notebook 16: the checker accepts the package's formula and names typical mistakes."""
from ddlcourse import perfmodel as pm
from ddlcourse.exercises import nb16_perfmodel as ex
from ddlcourse.selfcheck import run_checker


def test_accepts_the_reference():
    assert run_checker("ring_allreduce_time", lambda a, b, p, n: pm.ring_allreduce_time(n, p, pm.Link(a, 1 / b))).ok
    # and a correct solution written from the formula, p = 1 included
    assert run_checker("ring_allreduce_time", lambda a, b, p, n: 2 * (p - 1) * (a + n / p * b)).ok


def test_names_typical_mistakes():
    for wrong, hint in [(ex._ring_p_steps, "2(p-1) steps"), (ex._ring_half, "allgather"),
                        (ex._ring_whole_message, "n/p bytes"), (ex._ring_no_latency, "latency term"),
                        (ex._ring_bandwidth_as_beta, "time per byte")]:
        v = run_checker("ring_allreduce_time", wrong)
        assert not v.ok and hint in v.message, (wrong.__name__, v.message)


def test_unknown_mistake_and_unwritten_code():
    v = run_checker("ring_allreduce_time", lambda a, b, p, n: 1.0)
    assert not v.ok and "differs from the reference" in v.message

    def todo(a, b, p, n):
        raise NotImplementedError
    assert "not written yet" in run_checker("ring_allreduce_time", todo).message
