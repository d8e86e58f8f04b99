"""Exercises of notebooks/16_perfmodel.ipynb."""
from ddlcourse import perfmodel as pm
from ddlcourse.selfcheck import exercise


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
