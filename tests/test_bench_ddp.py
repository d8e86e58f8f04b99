"""The DDP / MPI-hook / Horovod benchmark runs under mpiexec and prints every figure it promises (no timing is
asserted), and its report computes efficiency and ratios from the times it is given."""
import re
import sys

import pytest

from ddlcourse import bench_ddp


def test_report_arithmetic():
    res = {"seconds": {"1 rank": 0.10, "DDP (gloo)": 0.20, "DDP (MPI hook)": 0.125, "Horovod": 0.125},
           "per_rep": {**{w: [0.0] * 3 for w in bench_ddp.WAYS}, "DDP (MPI hook)": [0.12, 0.125, 0.13]},
           "world_size": 2, "batch": 10, "n_params": 1234, "model": "mlp"}
    bw = {"ring": {"busbw": 2e9, "algbw": 2e9, "seconds": 1.0}, "mpi": {"busbw": 1e9, "algbw": 1e9, "seconds": 1.0}}
    text = bench_ddp.report(res, bw, {"gloo": [3e-4], "mpi": [3e-6]}, ring_mib=16)
    lines = {l.split("  ")[0].strip(): l for l in text.splitlines()}
    assert "0.50" in lines["DDP (gloo)"] and "1.600x" in lines["DDP (gloo)"]      # 0.1/0.2 ; 0.2/0.125
    assert "0.80" in lines["DDP (MPI hook)"] and "1.000x" in lines["DDP (MPI hook)"]
    assert " 160 " in lines["DDP (MPI hook)"]                                      # 2 ranks x 10 / 0.125 s
    assert "0.12000-0.13000" in lines["DDP (MPI hook)"]                             # min-max over the repetitions
    assert "ring / MPI = 2.00" in text and "gloo 300.0 µs, MPI 3.0 µs" in text


def test_gpu_ranks_time_nccl_not_the_mpi_hook():
    """On GPUs the MPI hook declines CUDA buckets: the benchmark times DDP over NCCL instead of raising."""
    import torch
    assert bench_ddp.ways_for(torch.device("cuda", 0)) == ("1 rank", "DDP (NCCL)", "Horovod")
    assert bench_ddp.ways_for(torch.device("cpu")) == bench_ddp.WAYS
    res = {"seconds": {"1 rank": 0.1, "DDP (NCCL)": 0.11, "Horovod": 0.12}, "per_rep": {"1 rank": [0.1]},
           "world_size": 8, "batch": 4, "n_params": 1, "model": "cnn", "device": "cuda:0", "horovod_comm": "NCCL"}
    text = bench_ddp.report(res, {"ring": {"busbw": 1.0}, "mpi": {"busbw": 1.0}}, {"gloo": [1e-4], "mpi": [1e-5]})
    assert "on cuda:0" in text and "Horovod reduces through NCCL" in text and "DDP (NCCL)" in text
    assert "MPI hook" not in text


def test_unknown_model():
    with pytest.raises(ValueError, match="unknown model"):
        bench_ddp.build("resnet", "cpu")


@pytest.mark.mpi
def test_benchmark_runs_on_two_ranks(mpi):
    code = "import sys; from ddlcourse import bench_ddp; sys.exit(bench_ddp.main(['--steps', '1', '--reps', '1', " \
           "'--batch', '4', '--ring-mib', '0.0625']))"
    out = mpi(2, code).stdout
    for way in bench_ddp.WAYS:
        assert re.search(rf"^{re.escape(way)}\s+\d+\.\d+\s+\d+", out, re.M), out
    assert "bus bandwidth" in out and "ring / MPI" in out and "allreduce of 64 floats" in out
