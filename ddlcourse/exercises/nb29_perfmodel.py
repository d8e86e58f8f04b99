"""Exercises of notebooks/29_perfmodel.ipynb."""
import numpy as np

from ddlcourse import perfmodel as pm
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


def _ring_p_steps(alpha, beta, p, n):          # 2p steps instead of 2(p-1)
    return 2 * p * alpha + 2 * n * beta


def _ring_half(alpha, beta, p, n):             # reduce-scatter only: the allgather half is missing
    return (p - 1) * alpha + (p - 1) / p * n * beta


def _ring_whole_message(alpha, beta, p, n):    # every step sends all n bytes, not n/p
    return 2 * (p - 1) * (alpha + n * beta)


def _ring_no_latency(alpha, beta, p, n):
    return 2 * (p - 1) / p * n * beta


def _ring_bandwidth_as_beta(alpha, beta, p, n):  # multiplied by the bandwidth instead of the time per byte
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / beta


def _ring_time_solution(alpha, beta, p, n):
    """Seconds of a ring allreduce, as a learner writes it: 2(p-1) steps of n/p bytes each."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta


@code_exercise("ring_allreduce_time", solution=_ring_time_solution, mistakes=[
    (_ring_p_steps, "not 2p"), (_ring_half, "reduce-scatter half"), (_ring_whole_message, "not the whole message"),
    (_ring_no_latency, "the latency term is missing"), (_ring_bandwidth_as_beta, "time per byte")])
def check_ring_allreduce_time(fn) -> Verdict:
    """``fn(alpha, beta, p, n)`` -> seconds of a ring allreduce of ``n`` bytes over ``p`` ranks."""
    got = [float(fn(*c)) for c in _RING_CASES]
    ref = [_ring_ref(*c) for c in _RING_CASES]
    wrong = lambda f: [f(*c) for c in _RING_CASES]  # noqa: E731
    return diagnose(got, ref, {
        "a ring takes 2(p-1) steps, not 2p: one rank already holds its own piece": wrong(_ring_p_steps),
        "that is only the reduce-scatter half: the allgather takes another (p-1) steps of n/p bytes (factor 2)":
            wrong(_ring_half),
        "each step sends one piece of n/p bytes, not the whole message": wrong(_ring_whole_message),
        "the latency term is missing: every one of the 2(p-1) steps costs alpha": wrong(_ring_no_latency),
        "beta is the time per byte (1 / bandwidth): multiply the bytes by beta": wrong(_ring_bandwidth_as_beta),
    }, rtol=1e-6, atol=1e-12, what="the time over a grid of (p, n)")


# --------------------------------------------------------------------------- build it: fit, then predict
# (alpha s, bandwidth B/s, n_params, t_compute s): a latency-bound and a bandwidth-bound case
_EFF_CASES = [(20e-6, 5e9, 2.5e6, 0.02), (3e-6, 0.8e9, 40e6, 0.5)]
_EFF_SIZES = [1e3, 1e4, 1e5, 1e6, 1e7, 4e7]
_EFF_WORLDS = [1, 2, 3, 4, 8, 64, 1024]


def _measured(alpha, bw):
    """Ping-pong timings of one message on this link: t = alpha + n / bandwidth (no noise: any fit agrees)."""
    sizes = np.array(_EFF_SIZES)
    return sizes, alpha + sizes / bw


def _efficiency_variant(kind: str | None = None):
    """``fn(sizes, times, n_params, t_compute, world_sizes)``: the reference (None) or one typical mistake."""
    def fn(sizes, times, n_params, t_compute, world_sizes):
        slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(times, float), 1)
        alpha, beta = (slope, intercept) if kind == "swapped" else (intercept, slope)
        nbytes = n_params if kind == "elements" else 4 * n_params
        out = []
        for N in world_sizes:
            lat = alpha if kind == "latency_once" and N > 1 else 2 * (N - 1) * alpha
            share = 1.0 if kind == "no_ring_factor" and N > 1 else 2 * (N - 1) / N
            out.append(t_compute / (t_compute + lat + share * nbytes * beta))
        return np.array(out)
    return fn


_EFF_HINTS = {
    "no_ring_factor": "each rank sends 2(N-1)/N times the gradient's bytes in a ring allreduce, not the bytes once",
    "latency_once": "the latency is paid at every one of the 2(N-1) steps of the ring, not once",
    "elements": "the gradient has n_params x 4 bytes in fp32: beta is a time per byte, not per element",
    "swapped": "alpha is the intercept and beta the slope of the fit (np.polyfit returns the slope first)",
}


def _efficiency_solution(sizes, times, n_params, t_compute, world_sizes):
    """Fit t = alpha + n beta to the timings, then the efficiency of data parallelism on N ranks."""
    n = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    A = np.stack([np.ones_like(n), n], axis=1)           # columns: 1 (for alpha), n (for beta)
    (alpha, beta), *_ = np.linalg.lstsq(A, t, rcond=None)
    grad_bytes = 4 * n_params                            # fp32 gradients
    eff = []
    for N in world_sizes:
        t_comm = 2 * (N - 1) * alpha + 2 * (N - 1) / N * grad_bytes * beta
        eff.append(t_compute / (t_compute + t_comm))
    return np.array(eff)


@code_exercise("alpha_beta_efficiency", solution=_efficiency_solution,
               mistakes=[(_efficiency_variant("no_ring_factor"), "2(N-1)/N times the gradient's bytes"),
                         (_efficiency_variant("latency_once"), "every one of the 2(N-1) steps"),
                         (_efficiency_variant("elements"), "n_params x 4 bytes"),
                         (_efficiency_variant("swapped"), "alpha is the intercept")])
def check_alpha_beta_efficiency(fn) -> Verdict:
    """``fn(sizes, times, n_params, t_compute, world_sizes)`` -> the efficiency on each world size, shape (W,)."""
    for alpha, bw, n_params, t_compute in _EFF_CASES:
        sizes, times = _measured(alpha, bw)
        args = (sizes.copy(), times.copy(), n_params, t_compute, list(_EFF_WORLDS))
        got = np.asarray(fn(*args), dtype=float).reshape(-1)
        ref = _efficiency_variant()(*args)
        serial = t_compute / (t_compute + np.array([pm.ring_allreduce_time(4 * n_params, N, pm.Link(alpha, bw))
                                                     for N in _EFF_WORLDS]))
        assert np.allclose(ref, serial, rtol=1e-6), "the reference disagrees with perfmodel"
        v = diagnose(got, ref, {h: _efficiency_variant(k)(*args) for k, h in _EFF_HINTS.items()},
                     rtol=1e-6, atol=1e-9, what=f"the efficiency on N = {_EFF_WORLDS}")
        if not v.ok:
            if got.shape == ref.shape and abs(got[0] - 1) > 1e-6:
                return Verdict(False, "one rank sends nothing: the efficiency on N = 1 is 1. " + v.message)
            return v
    return Verdict(True)
