"""Exercises of notebooks/04_collectives.ipynb."""
import math

from ddlcourse.selfcheck import exercise


@exercise("ring_bytes_per_rank", "reduce-scatter and allgather each send N-1 chunks of n/N bytes")
def ring_bytes_per_rank(nbytes: float, n_ranks: int) -> float:
    return 2 * (n_ranks - 1) / n_ranks * nbytes


@exercise("recursive_doubling_rounds", "each round doubles the number of ranks whose data you hold")
def recursive_doubling_rounds(n_ranks: int) -> int:
    return int(math.ceil(math.log2(n_ranks)))


@exercise("alpha_beta_crossover", "the message size at which the latency term "
          "and the bandwidth term of T = alpha + beta * n are equal")
def alpha_beta_crossover(alpha: float, beta: float) -> float:
    return alpha / beta
