"""The coding exercise of notebook 08 (scaling): speedup and efficiency from measured step times."""
from ddlcourse import bench
from ddlcourse.exercises import nb08_scaling as ex
from ddlcourse.selfcheck import run_checker


def test_strong_scaling_accepts_reference():
    v = run_checker("strong_scaling", lambda t: {r.ranks: (r.speedup, r.efficiency)
                                                 for r in bench.scaling_table(t, "strong")})
    assert v.ok, v.message


def test_strong_scaling_accepts_a_hand_written_solution():
    def mine(times):
        base = min(times)
        return {n: (times[base] / t, times[base] / t / (n / base)) for n, t in times.items()}
    assert run_checker("strong_scaling", mine).ok


def test_strong_scaling_names_mistakes():
    for kind, hint in [("inverted", "upside down"), ("no_divide", "did not divide"), ("over_n", "not by N")]:
        v = run_checker("strong_scaling", ex._scaling_variant(kind))
        assert not v.ok and hint in v.message, (kind, v.message)


def test_strong_scaling_not_written():
    def skeleton(times):
        raise NotImplementedError
    v = run_checker("strong_scaling", skeleton)
    assert not v.ok and "not written yet" in v.message
