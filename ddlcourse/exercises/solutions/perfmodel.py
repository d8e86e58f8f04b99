"""Reference solutions of notebooks/29_perfmodel.ipynb: the ring allreduce's time, and the efficiency of data
parallelism predicted from a fitted alpha-beta model; each with typical mistakes (what
:mod:`ddlcourse.exercises.checkers.perfmodel` must name)."""
import numpy as np

from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- coding exercise: the ring formula
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


RING_TIME_VARIANTS = {"p_steps": _ring_p_steps, "half": _ring_half, "whole_message": _ring_whole_message,
                      "no_latency": _ring_no_latency, "bandwidth_as_beta": _ring_bandwidth_as_beta}


@reference("ring_allreduce_time", mistakes=[
    (_ring_p_steps, "not 2p"), (_ring_half, "reduce-scatter half"), (_ring_whole_message, "not the whole message"),
    (_ring_no_latency, "the latency term is missing"), (_ring_bandwidth_as_beta, "time per byte")])
def _ring_time_solution(alpha, beta, p, n):
    """Seconds of a ring allreduce, as a learner writes it: 2(p-1) steps of n/p bytes each."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta


# --------------------------------------------------------------------------- build it: fit, then predict
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


EFF_VARIANTS = {kind: _efficiency_variant(kind) for kind in ("no_ring_factor", "latency_once", "elements", "swapped")}


@reference("alpha_beta_efficiency", mistakes=[
    (EFF_VARIANTS["no_ring_factor"], "2(N-1)/N times the gradient's bytes"),
    (EFF_VARIANTS["latency_once"], "every one of the 2(N-1) steps"),
    (EFF_VARIANTS["elements"], "n_params x 4 bytes"),
    (EFF_VARIANTS["swapped"], "alpha is the intercept")])
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
