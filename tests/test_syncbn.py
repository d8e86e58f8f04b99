"""The allreduce SyncBatchNorm equals full-batch nn.BatchNorm on one process.

Compared: outputs, input gradients, weight/bias gradients and running statistics, for 1D/2D/3D inputs,
on one process and on 2-3 ranks (unequal per-rank batch sizes included).
"""
import copy

import pytest
import torch
from torch import nn

from ddlcourse.parallel.syncbn import SyncBatchNorm, convert_sync_batchnorm

from helpers import run_ranks

CASES = [((12, 5), nn.BatchNorm1d), ((12, 5, 7), nn.BatchNorm1d), ((6, 5, 4, 3), nn.BatchNorm2d),
         ((6, 5, 2, 3, 3), nn.BatchNorm3d)]


def _ref_bn(cls, momentum=0.1, affine=True):
    torch.manual_seed(3)
    bn = cls(5, momentum=momentum, affine=affine)
    if affine:
        with torch.no_grad():
            bn.weight.uniform_(0.5, 2.0)
            bn.bias.uniform_(-1, 1)
    return bn


@pytest.mark.parametrize("shape,cls", CASES)
@pytest.mark.parametrize("momentum", [0.1, None])
def test_single_process_matches_batchnorm(shape, cls, momentum):
    ref = _ref_bn(cls, momentum)
    mine = convert_sync_batchnorm(copy.deepcopy(ref))
    assert isinstance(mine, SyncBatchNorm)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randn(*shape, generator=g) * 3 + 2
        R = torch.randn(*shape, generator=g)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        y1, y2 = ref(x1), mine(x2)
        (y1 * R).sum().backward()
        (y2 * R).sum().backward()
        torch.testing.assert_close(y2, y1, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine.bias.grad, ref.bias.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine.running_mean, ref.running_mean)
    torch.testing.assert_close(mine.running_var, ref.running_var)
    assert int(mine.num_batches_tracked) == int(ref.num_batches_tracked) == 3
    ref.eval(); mine.eval()
    x = torch.randn(*shape, generator=g)
    torch.testing.assert_close(mine(x), ref(x))


def test_no_affine_and_no_running_stats():
    ref = nn.BatchNorm2d(4, affine=False, track_running_stats=False)
    mine = convert_sync_batchnorm(copy.deepcopy(ref))
    x = torch.randn(5, 4, 3, 3, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    ref(x).pow(2).sum().backward()
    mine(x2).pow(2).sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-5)
    mine.eval()  # no running stats: eval still normalises with the batch
    torch.testing.assert_close(mine(x2), ref.eval()(x2))


def test_convert_nested_keeps_state_and_mode():
    from ddlcourse.models.small import SmallCNN
    m = SmallCNN(width=4)
    m.features[1].running_mean.fill_(0.5)
    m.eval()
    c = convert_sync_batchnorm(m)
    bns = [mod for mod in c.modules() if isinstance(mod, nn.modules.batchnorm._BatchNorm)]
    assert bns and all(isinstance(b, SyncBatchNorm) for b in bns)
    assert torch.all(c.features[1].running_mean == 0.5) and not c.features[1].training


def test_bad_input():
    with pytest.raises(ValueError, match="shape"):
        SyncBatchNorm(3)(torch.randn(3))
    with pytest.raises(ValueError, match="channels"):
        SyncBatchNorm(3)(torch.randn(4, 2))
    with pytest.raises(ValueError, match="empty global batch"):      # on CPU tensors the count is checked
        SyncBatchNorm(3)(torch.randn(0, 3, 2))


@pytest.mark.parametrize("momentum", [0.1, 0.0])
def test_forward_and_backward_never_read_a_device_tensor_on_the_host(momentum):
    """On a GPU, reading the global count (``if count < 1``) would stall the stream in every layer.

    Meta tensors have no data, so any host read of one (``bool``, ``item``, ``float``) raises: a forward and
    backward in training mode on the meta device proves there is none.
    """
    bn = SyncBatchNorm(3, momentum=momentum, device="meta")
    x = torch.empty(4, 3, 5, 5, device="meta", requires_grad=True)
    y = bn(x)
    y.sum().backward()
    assert y.device.type == x.grad.device.type == bn.running_var.device.type == "meta"


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("via", ["auto", "torch"])
def test_multi_rank_matches_full_batch(n, via):
    """Both allreduce paths: MPI for CPU tensors ("auto") and torch.distributed (gloo here, NCCL on GPUs)."""
    worst, comms = run_ranks(n, "syncbn_multi_rank_vs_full_batch", via).stdout.strip().splitlines()[-1].split()
    assert float(worst) < 2e-5, worst
    assert int(comms) == (1 if via == "auto" else 0)     # the path asked for is the path taken
