"""The synthetic benchmark runs on 1 and 2 ranks, from the CLI and as a function; no timing is asserted."""
import pytest
import torch

from ddlcourse import synthetic_bench as sb

from helpers import run_ranks


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


@pytest.mark.mpi
def test_cli_two_ranks():
    # (the horovod backend is exercised by tests/test_data_parallel.py; here the CLI plumbing is tested)
    out = run_ranks(2, "synthetic_bench_cli", "ddp", timeout=120).stdout
    assert "Total img/sec on 2 rank(s):" in out and "Img/sec per rank:" in out


@pytest.mark.mpi
def test_function_with_subgroup():
    assert run_ranks(2, "synthetic_bench_subgroup").stdout.strip().endswith("ok")
