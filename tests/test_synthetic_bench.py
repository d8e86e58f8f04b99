"""The synthetic benchmark runs on 1 and 2 ranks, from the CLI and as a function; no timing is asserted."""
import pytest
import torch

from ddlcourse import synthetic_bench as sb


@pytest.mark.parametrize("name", sb.MODELS)
def test_models_shape(name):
    m = sb.build_model(name, image_size=16, width=4, n_classes=10)
    assert m(torch.randn(2, 3, 16, 16)).shape == (2, 10)


def test_resnet_stems():
    """224x224 images get ResNet's strided ImageNet stem (blocks see 56x56), small images the stride-1 one."""
    x = torch.randn(2, 3, 64, 64)
    assert sb.TinyResNet(width=4, stem="imagenet").stem(x).shape == (2, 4, 16, 16)
    assert sb.TinyResNet(width=4, stem="cifar").stem(x).shape == (2, 4, 64, 64)
    assert sb.build_model("resnet", 224, width=4).stem[0].stride == (2, 2)
    assert sb.build_model("resnet", 32, width=4).stem[0].stride == (1, 1)
    assert sb.build_model("resnet", 224, width=64)(torch.randn(1, 3, 224, 224)).shape == (1, 10)
    assert sum(p.numel() for p in sb.build_model("resnet", 224, width=64, n_classes=1000).parameters()) == 11_689_512
    with pytest.raises(ValueError, match="unknown stem"):
        sb.TinyResNet(stem="vgg")


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown model"):
        sb.build_model("vgg", 16)
    with pytest.raises(ValueError, match="unknown backend"):
        sb.run(backend="nccl2")
    with pytest.raises(ValueError, match="no rank"):
        sb.summarize([None])


CLI = r"""
from ddlcourse import synthetic_bench as sb
sb.main(["--model", "smallcnn", "--batch-size", "4", "--image-size", "16", "--width", "4",
         "--backend", "{backend}", "--num-iters", "2", "--num-batches-per-iter", "1"])
"""

FN = r"""
from mpi4py import MPI
from ddlcourse import dist, synthetic_bench as sb
dist.init()
one = sb.run(model="mlp", batch_size=4, image_size=8, width=2, num_iters=1, batches_per_iter=1, n_ranks=1)
two = sb.run(model="resnet", batch_size=2, image_size=8, width=2, num_iters=1, batches_per_iter=1)
res = MPI.COMM_WORLD.gather((one, two), root=0)
dist.shutdown()
if dist.rank() == 0:
    assert res[1][0] is None and res[0][0]["world_size"] == 1
    s = sb.summarize([r[1] for r in res])
    assert s["world_size"] == 2 and s["img_sec_total"] > 0
    print("ok")
"""


@pytest.mark.mpi
def test_cli_two_ranks(mpi):
    # (the horovod backend is exercised by tests/test_data_parallel.py; here the CLI plumbing is tested)
    out = mpi(2, CLI.replace("{backend}", "ddp"), timeout=120).stdout
    assert "Total img/sec on 2 rank(s):" in out and "Img/sec per rank:" in out


@pytest.mark.mpi
def test_function_with_subgroup(mpi):
    assert mpi(2, FN).stdout.strip().endswith("ok")
