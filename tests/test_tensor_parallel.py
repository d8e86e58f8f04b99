"""Megatron-style column/row-parallel linear layers against the serial MLP, forward and backward."""
import pytest

from helpers import run_ranks


@pytest.mark.parametrize("n", [2, 4])
def test_tensor_parallel_matches_serial(n):
    p = run_ranks(n, "tensor_parallel_vs_serial")
    assert float(p.stdout.split("WORST")[1].split()[0]) < 1e-5, p.stdout


def test_hybrid_mesh_matches_serial():
    p = run_ranks(4, "tensor_parallel_hybrid_mesh")
    assert float(p.stdout.split("WORST")[1].split()[0]) < 1e-5, p.stdout
    assert "[(0, 0), (0, 1), (1, 0), (1, 1)]" in p.stdout
