"""The DDP (each hook mode) / Horovod benchmark runs under mpiexec and prints every figure it promises (no timing
is asserted), and its report computes efficiency and the DDP / Horovod ratios from the times it is given."""
import re

import pytest

from ddlcourse.tools import bench_ddp
from ddlcourse.parallel import mpi_hook


def _res(model, per_rep, n=2, batch=10):
    import statistics
    return {"seconds": {w: statistics.median(v) for w, v in per_rep.items()}, "per_rep": per_rep,
            "world_size": n, "batch": batch, "n_params": 1234, "model": model}


def test_every_hook_mode_is_a_way():
    assert sorted(bench_ddp.HOOK_WAYS.values()) == sorted(mpi_hook.MODES)
    assert bench_ddp.WAYS[0] == "1 rank" and bench_ddp.WAYS[-1] == "Horovod"


def test_report_arithmetic():
    per_rep = {"1 rank": [0.1] * 3, "DDP default (gloo)": [0.2] * 3, "DDP mpi": [0.15] * 3,
               "DDP mpi-overlap": [0.12, 0.125, 0.13], "Horovod": [0.125] * 3}
    text = bench_ddp.report_model(_res("mlp", per_rep))
    lines = {l.split("  ")[0].strip(): l for l in text.splitlines() if not l.startswith("  ")}
    assert "0.50" in lines["DDP default (gloo)"] and "1.600x" in lines["DDP default (gloo)"]   # 0.1/0.2; 0.2/0.125
    assert "0.80" in lines["DDP mpi-overlap"] and "1.000x" in lines["DDP mpi-overlap"]
    assert " 160 " in lines["DDP mpi-overlap"]                                   # 2 ranks x 10 / 0.125 s
    assert "0.12000-0.13000" in lines["DDP mpi-overlap"]                         # min-max over the repetitions
    # the MLP: step-time ratio DDP / Horovod per repetition: 0.96, 1.00, 1.04
    assert "step-time ratio" in text and re.search(r"^  DDP mpi-overlap\s+1\.000 \(0\.960-1\.040\)$", text, re.M)
    assert re.search(r"^  DDP default \(gloo\)\s+1\.600 \(1\.600-1\.600\)$", text, re.M)


def test_cnn_reports_the_throughput_ratio():
    per_rep = {"1 rank": [0.1] * 2, "DDP default (gloo)": [0.2, 0.25], "DDP mpi": [0.1] * 2,
               "DDP mpi-overlap": [0.1] * 2, "Horovod": [0.1, 0.1]}
    text = bench_ddp.report_model(_res("cnn", per_rep))
    assert "throughput ratio" in text
    assert re.search(r"^  DDP default \(gloo\)\s+0\.450 \(0\.400-0\.500\)$", text, re.M), text    # 0.1/0.2, 0.1/0.25
    assert bench_ddp.ratios(_res("cnn", per_rep), throughput=False)["DDP default (gloo)"] == (2.25, 2.0, 2.5)


def test_report_comm():
    bw = {"ring": {"busbw": 2e9, "algbw": 2e9, "seconds": 1.0}, "mpi": {"busbw": 1e9, "algbw": 1e9, "seconds": 1.0}}
    text = bench_ddp.report_comm(bw, {"gloo": [3e-4], "mpi": [3e-6]}, ring_mib=16)
    assert "ring / MPI = 2.00" in text and "gloo 300.0 µs, MPI 3.0 µs" in text


def test_gpu_ranks_time_nccl_not_the_mpi_hook():
    """On GPUs the MPI hook declines CUDA buckets: the benchmark times DDP over NCCL instead of raising."""
    import torch
    assert bench_ddp.ways_for(torch.device("cuda", 0)) == ("1 rank", "DDP (NCCL)", "Horovod")
    assert bench_ddp.ways_for(torch.device("cpu")) == bench_ddp.WAYS
    res = _res("cnn", {"1 rank": [0.1], "DDP (NCCL)": [0.11], "Horovod": [0.12]}, n=8, batch=4)
    res.update(device="cuda:0", horovod_comm="NCCL")
    text = bench_ddp.report_model(res)
    assert "on cuda:0" in text and "Horovod reduces through NCCL" in text and "DDP (NCCL)" in text
    assert "mpi" not in text.replace("MPI", "")


def test_unknown_model():
    with pytest.raises(ValueError, match="unknown model"):
        bench_ddp.build("resnet", "cpu")


@pytest.mark.mpi
def test_benchmark_runs_on_two_ranks(mpi):
    code = "import sys; from ddlcourse.tools import bench_ddp; sys.exit(bench_ddp.main(['--steps', '1', '--reps', '2', " \
           "'--batch', '4', '--ring-mib', '0.0625']))"
    out = mpi(2, code).stdout
    for model in bench_ddp.MODELS:
        assert re.search(rf"^model {model} \(", out, re.M), out
    for way in bench_ddp.WAYS:
        assert len(re.findall(rf"^{re.escape(way)}\s+\d+\.\d+\s+\d+", out, re.M)) == 2, out    # both models
    for way in bench_ddp.HOOK_WAYS:
        assert len(re.findall(rf"^  {re.escape(way)}\s+\d+\.\d+ \(\d+\.\d+-\d+\.\d+\)$", out, re.M)) == 2, out
    assert "throughput ratio" in out and "step-time ratio" in out
    assert "bus bandwidth" in out and "ring / MPI" in out and "allreduce of 64 floats" in out
