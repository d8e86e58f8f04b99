"""The coding exercises of notebook 29. tests/test_build_it.py checks the references and the registered
mistakes; here: other correct solutions are accepted and unknown mistakes are described."""
import numpy as np

from ddlcourse import perfmodel as pm
from ddlcourse.exercises.solutions import perfmodel as ex
from ddlcourse.selfcheck import run_checker


def test_ring_time_accepts_the_package_formula():
    assert run_checker("ring_allreduce_time", lambda a, b, p, n: pm.ring_allreduce_time(n, p, pm.Link(a, 1 / b))).ok
    assert run_checker("ring_allreduce_time", lambda a, b, p, n: 2 * (p - 1) * (a + n / p * b)).ok


def test_ring_time_unknown_mistake():
    v = run_checker("ring_allreduce_time", lambda a, b, p, n: 1.0)
    assert not v.ok and "differs from the reference" in v.message


def test_efficiency_accepts_polyfit_and_the_package():
    def with_pm(sizes, times, n_params, t_compute, world_sizes):
        beta, alpha = np.polyfit(sizes, times, 1)
        link = pm.Link(alpha, 1 / beta)
        return [t_compute / (t_compute + pm.ring_allreduce_time(4 * n_params, N, link)) for N in world_sizes]
    assert run_checker("alpha_beta_efficiency", with_pm).ok


def test_the_mistakes_are_variants_of_a_right_model():
    """The checker compares with perfmodel and names a mistake by the variant that gives the learner's answer: without
    a mistake, that model is right (the checker used to assert this on every check)."""
    assert run_checker("alpha_beta_efficiency", ex._efficiency_variant()).ok


def test_efficiency_unknown_mistake():
    v = run_checker("alpha_beta_efficiency", lambda s, t, n, tc, ws: [0.5] * len(ws))
    assert not v.ok and "efficiency on N = 1 is 1" in v.message
