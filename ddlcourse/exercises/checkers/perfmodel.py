"""Checkers of notebooks/29_perfmodel.ipynb: its questions, the ring allreduce's time, and the efficiency of data
parallelism the learner predicts from a fitted alpha-beta model."""
import numpy as np

from ddlcourse import perfmodel as pm
from ddlcourse.exercises.solutions.perfmodel import EFF_VARIANTS, RING_TIME_VARIANTS
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("ring_allreduce_ms", "ring: 2(p-1) alpha + 2(p-1)/p * n * beta; bytes = params x 4 for fp32; "
          "answer in milliseconds")
def ring_allreduce_ms(n_params: float, p: int, alpha_us: float, gbytes_per_s: float) -> float:
    link = pm.Link(alpha_us * 1e-6, gbytes_per_s * 1e9)
    return 1e3 * pm.ring_allreduce_time(4 * n_params, p, link)


@exercise("fp16_gradient_bytes", "fp16 gradients take 2 bytes per parameter instead of 4")
def fp16_gradient_bytes(n_params: float) -> float:
    return 2 * n_params


@exercise("gpipe_bubble", "GPipe idles (S - 1) / (M + S - 1) of each step with S stages and M micro-batches")
def gpipe_bubble(num_stages: int, n_micro: int) -> float:
    return (num_stages - 1) / (n_micro + num_stages - 1)


# --------------------------------------------------------------------------- coding exercise: the ring formula
# (alpha s, beta s/byte, p ranks, n bytes): small and large messages, few and many ranks, p = 1 included
_RING_CASES = [(5e-6, 1 / 12.5e9, p, n) for p in (1, 2, 3, 8, 64) for n in (4e3, 1e6, 1.024e8)]


def _ring_ref(alpha, beta, p, n):
    return pm.ring_allreduce_time(n, p, pm.Link(alpha, 1.0 / beta))


_RING_TIME_HINTS = {
    "p_steps": "a ring takes 2(p-1) steps, not 2p: one rank already holds its own piece",
    "half": "that is only the reduce-scatter half: the allgather takes another (p-1) steps of n/p bytes (factor 2)",
    "whole_message": "each step sends one piece of n/p bytes, not the whole message",
    "no_latency": "the latency term is missing: every one of the 2(p-1) steps costs alpha",
    "bandwidth_as_beta": "beta is the time per byte (1 / bandwidth): multiply the bytes by beta",
}


@code_exercise("ring_allreduce_time")
def check_ring_allreduce_time(fn) -> Verdict:
    """``fn(alpha, beta, p, n)`` -> seconds of a ring allreduce of ``n`` bytes over ``p`` ranks."""
    got = [float(fn(*c)) for c in _RING_CASES]
    ref = [_ring_ref(*c) for c in _RING_CASES]
    wrong = lambda f: [f(*c) for c in _RING_CASES]  # noqa: E731
    return diagnose(got, ref, {hint: wrong(RING_TIME_VARIANTS[kind]) for kind, hint in _RING_TIME_HINTS.items()},
                    rtol=1e-6, atol=1e-12, what="the time over a grid of (p, n)")


# --------------------------------------------------------------------------- build it: fit, then predict
# (alpha s, bandwidth B/s, n_params, t_compute s): a latency-bound and a bandwidth-bound case
_EFF_CASES = [(20e-6, 5e9, 2.5e6, 0.02), (3e-6, 0.8e9, 40e6, 0.5)]
_EFF_SIZES = [1e3, 1e4, 1e5, 1e6, 1e7, 4e7]
_EFF_WORLDS = [1, 2, 3, 4, 8, 64, 1024]


def _measured(alpha, bw):
    """Ping-pong timings of one message on this link: t = alpha + n / bandwidth (no noise: any fit agrees)."""
    sizes = np.array(_EFF_SIZES)
    return sizes, alpha + sizes / bw


_EFF_HINTS = {
    "no_ring_factor": "each rank sends 2(N-1)/N times the gradient's bytes in a ring allreduce, not the bytes once",
    "latency_once": "the latency is paid at every one of the 2(N-1) steps of the ring, not once",
    "elements": "the gradient has n_params x 4 bytes in fp32: beta is a time per byte, not per element",
    "swapped": "alpha is the intercept and beta the slope of the fit (np.polyfit returns the slope first)",
}


@code_exercise("alpha_beta_efficiency")
def check_alpha_beta_efficiency(fn) -> Verdict:
    """``fn(sizes, times, n_params, t_compute, world_sizes)`` -> the efficiency on each world size, shape (W,)."""
    for alpha, bw, n_params, t_compute in _EFF_CASES:
        sizes, times = _measured(alpha, bw)
        args = (sizes.copy(), times.copy(), n_params, t_compute, list(_EFF_WORLDS))
        got = np.asarray(fn(*args), dtype=float).reshape(-1)
        # the reference: perfmodel's ring allreduce on the link the timings were made on
        ref = t_compute / (t_compute + np.array([pm.ring_allreduce_time(4 * n_params, N, pm.Link(alpha, bw))
                                                  for N in _EFF_WORLDS]))
        v = diagnose(got, ref, {h: EFF_VARIANTS[k](*args) for k, h in _EFF_HINTS.items()},
                     rtol=1e-6, atol=1e-9, what=f"the efficiency on N = {_EFF_WORLDS}")
        if not v.ok:
            if got.shape == ref.shape and abs(got[0] - 1) > 1e-6:
                return Verdict(False, "one rank sends nothing: the efficiency on N = 1 is 1. " + v.message)
            return v
    return Verdict(True)
