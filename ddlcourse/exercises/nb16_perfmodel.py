"""Exercises of notebooks/16_perfmodel.ipynb."""
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


@code_exercise("ring_allreduce_time")
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
