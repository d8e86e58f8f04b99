"""All three data-parallel backends give the serial result on the same global batch."""
import pytest

from helpers import run_ranks

pytestmark = pytest.mark.mpi


def test_three_backends_match_serial():
    worst = float(run_ranks(2, "data_parallel_wrap_backends").stdout.strip())
    assert worst < 1e-5, worst


def test_bad_backend():
    import torch
    from ddlcourse.parallel.data_parallel import wrap
    m = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="unknown data-parallel backend"):
        wrap(m, torch.optim.SGD(m.parameters(), lr=1), backend="nccl")
