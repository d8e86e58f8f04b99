"""Loss integrity: the same global batch on 1 and 4 ranks (oversubscribed) gives the same loss trajectory.

The uneven case is built in: 202 samples in global batches of 32 leave a last batch of 10, split 3/3/2/2.
"""
import json

import pytest

from ddlcourse import integrity

pytestmark = pytest.mark.mpi

CODE = r"""
import json
from ddlcourse import dist, integrity as I
cfg = dict(n_samples=202, global_batch=32, epochs=2)
ref = I.serial(**cfg)
ref_bn = I.serial(batchnorm=True, **cfg)
r1 = I.run(1, **cfg)   # collective: every rank calls it; ranks 1-3 get None
out = {
    "k1": I.max_difference(r1, ref) if dist.rank() == 0 else None,
    "k4": I.max_difference(I.run(4, **cfg), ref),
    "k4_syncbn": I.max_difference(I.run(4, batchnorm=True, **cfg), ref_bn),
}
for m in ("sum_grads", "mean_of_means", "sampler_padding", "sampler_drop_last", "same_aug_seed"):
    out[m] = I.max_difference(I.run(4, m, **cfg), ref)
out["per_rank_bn"] = I.max_difference(I.run(4, "per_rank_bn", batchnorm=True, **cfg), ref_bn)
out["steps"] = len(ref)
dist.shutdown()
if dist.rank() == 0:
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def results(request):
    from conftest import run_mpi
    return json.loads(run_mpi(4, CODE).stdout.strip().splitlines()[-1])


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
