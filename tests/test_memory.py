"""Memory prediction and measurement: exact parts, activation growth, checkpointing, bf16 autocast."""
import torch
from torch import nn

from ddlcourse import memory


def _batch(n=32, dim=64):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, dim, generator=g), torch.randint(0, 4, (n,), generator=g)


def test_predicted_equals_measured_for_weights_grads_state():
    for opt in ("sgd", "momentum", "adam"):
        torch.manual_seed(0)
        m = memory.mlp(64, 128, 3)
        x, y = _batch()
        p, q = memory.predict(m, x, opt), memory.measure(m, x, y, optimizer=opt)
        for k in ("params", "grads", "optimizer"):
            assert p[k] == q[k], (opt, k, p, q)
        assert q["activations"] > 0


def test_activations_grow_with_volume():
    rows = memory.activation_sweep([8, 16], ndim=3)
    ratio = rows[1]["activations"] / rows[0]["activations"]
    assert 7.0 < ratio < 8.5, rows                       # side x2 -> voxels x8
    assert rows[0]["params"] == rows[1]["params"]


def test_checkpointing_saves_memory_and_keeps_gradients():
    torch.manual_seed(0)
    seq = memory.mlp(64, 256, 12)
    x, y = _batch()
    plain = memory.measure(seq, x, y, optimizer="sgd")["activations"]
    torch.manual_seed(0)
    seq2 = memory.mlp(64, 256, 12)
    ck = memory.measure(memory.checkpointed(seq2, 4), x, y, optimizer="sgd")["activations"]
    assert ck < 0.6 * plain, (ck, plain)
    # same gradients with and without checkpointing (measure() stepped plain SGD, lr 1e-3: compare weights)
    for a, b in zip(seq.parameters(), seq2.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_bf16_autocast_halves_activations():
    torch.manual_seed(0)
    m = memory.mlp(64, 256, 4)
    x, y = _batch(1024)                                  # activations dominate the bf16 weight copies
    fp32 = memory.measure(m, x, y, optimizer="sgd")["activations"]
    bf16 = memory.measure(m, x, y, optimizer="sgd", autocast=True)["activations"]
    assert bf16 < 0.75 * fp32, (bf16, fp32)


def test_saved_bytes_counts_what_backward_keeps_without_the_parameters():
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    x = torch.randn(16, 4)
    with memory.SavedTensors(skip=m.parameters()) as mem:
        m(x).sum()
    # Linear keeps its input (16 x 4 floats) and its weight (a parameter: not counted); ReLU keeps its output
    assert mem.bytes == 4 * (16 * 4 + 16 * 8) and len(mem.sizes) == 2
    assert mem.mb == mem.bytes / 2 ** 20
    with memory.SavedTensors(skip=m.parameters()) as none:
        with torch.no_grad():
            m(x)
    assert none.bytes == 0
