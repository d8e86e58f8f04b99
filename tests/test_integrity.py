"""Loss integrity: the same global batch on 1 and 4 ranks (oversubscribed) gives the same loss trajectory.

The uneven case is built in: 202 samples in global batches of 32 leave a last batch of 10, split 3/3/2/2.
"""
import json

import pytest

from ddlcourse import integrity

from helpers import run_ranks

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def results(request):
    return json.loads(run_ranks(4, "integrity_one_and_four_ranks").stdout.strip().splitlines()[-1])


def test_one_and_four_ranks_match(results):
    assert results["steps"] == 14
    assert results["k1"] < 1e-12          # 1 rank of the MPI world == no MPI at all
    assert results["k4"] < 1e-9           # 4 ranks: only the allreduce's summation order differs
    assert results["k4_syncbn"] < 1e-9    # with (synchronised) batch norm too


@pytest.mark.parametrize("mistake", ["sum_grads", "mean_of_means", "sampler_padding", "sampler_drop_last",
                                     "same_aug_seed", "per_rank_bn"])
def test_each_mistake_bends_the_curve(results, mistake):
    assert results[mistake] > 1e-6


def test_serial_is_deterministic_and_learns():
    a, b = integrity.serial(epochs=2), integrity.serial(epochs=2)
    assert a == b
    assert sum(a[-4:]) / 4 < sum(a[:4]) / 4


def test_bad_input():
    with pytest.raises(ValueError, match="unknown mistake"):
        integrity.serial("oops")
    with pytest.raises(ValueError, match="batchnorm=True"):
        integrity.serial("per_rank_bn")
    with pytest.raises(ValueError, match="unknown IntegrityConfig"):
        integrity.make_config(nope=1)
    assert integrity.weak_scaling(4, 16, 0.1, "linear")["global_batch"] == 64


def _float32_run(shares: int, grad_scale: float = 1.0, steps: int = 200) -> list[float]:
    """SGD on a small float32 MLP; each global batch of 32 is split into ``shares`` parts whose gradients are
    added one after the other, as an allreduce of ``shares`` ranks would (another summation order)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    torch.manual_seed(0)
    X = torch.randn(512, 16)
    y = (X @ torch.randn(16, 4)).argmax(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    hist = []
    for _ in range(steps):
        idx = torch.randint(0, 512, (32,), generator=g)
        opt.zero_grad()
        total = 0.0
        for part in idx.chunk(shares):
            loss = F.cross_entropy(model(X[part]), y[part], reduction="sum") / 32
            (loss * grad_scale).backward()
            total += loss.item()
        opt.step()
        hist.append(total)
    return hist


def test_float32_trajectories_agree_despite_amplified_rounding_but_not_with_a_mistake():
    serial, four = _float32_run(1), _float32_run(4)
    # rounding alone: tiny at first, amplified by training to far above 1e-4 at single steps later on
    assert integrity.max_difference(serial[:10], four[:10]) < 1e-5
    assert integrity.max_difference(serial, four) > 1e-4
    assert integrity.trajectories_agree(serial, four)
    # summed instead of averaged gradients over 4 ranks: caught in the first steps
    assert not integrity.trajectories_agree(serial, _float32_run(4, grad_scale=4.0))
    # a run that drifts later (same first steps, mean loss 5% higher) or is cut short does not agree
    drift = serial[:10] + [v * 1.05 for v in serial[10:]]
    assert not integrity.trajectories_agree(serial, drift)
    assert not integrity.trajectories_agree(serial, serial[:-1])
    assert not integrity.trajectories_agree(serial, serial[:-1] + [float("nan")])
