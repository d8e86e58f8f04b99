"""The planner counts what GPU 0 holds besides a workload: NCCL communicators (world, subgroups, mesh dimensions,
the labs' grid lines, send/recv pairs, Horovod's), other CUDA contexts (notebook kernel, kernels of notebooks 10 and
23 left running, a second cluster, a job beside the engines), second copies (notebook 24's compiled model, notebook
22's traffic measurement). Each test fails on the planner that left them out."""
import ast
import json
import re

import pytest

from ddlcourse import config
from ddlcourse.tools import plan

from helpers import ROOT, cell_source, notebook_cells, run_ranks


def test_communicators_are_counted_per_subgroup():
    ov = plan.overheads("loss_integrity", "cluster")
    n = config.sizes("loss_integrity", "cluster").n_ranks
    assert ov.groups[0] == n                                   # the world
    assert sorted(ov.groups[1:]) == sorted({1, 2, 4, n})       # one per dist.subgroup(k)
    assert ov.nccl_bytes == 4 * plan.NCCL_COMM_BYTES + plan.NCCL_SOLO_BYTES
    row = plan.plan_section("loss_integrity", "cluster")
    assert row.gpu.overhead == ov.bytes and row.gpu.gpu_total >= plan.CUDA_OVERHEAD + ov.bytes


def test_horovod_and_mesh_dimensions_add_communicators():
    assert plan.overheads("data_parallel", "cluster").communicators == 2          # world + Horovod's
    assert plan.overheads("sync_batchnorm", "cluster").communicators == 1
    maize, topology = plan.overheads("lab_maize", "cluster"), plan.overheads("topology", "cluster")
    assert maize.communicators == topology.communicators + 1                   # Horovod runs in lab 1 only
    native = plan.overheads("native_sharding_checkpoints", "cluster")
    assert native.communicators == 1 + 2                      # world, the (dp, tp) mesh's 2 dims


def test_no_notebook_keeps_two_clusters_alive_so_one_context_besides_the_ranks():
    """The planner counts one other CUDA context (the kernel's) per notebook; a notebook that kept a second
    cluster alive beside the first would put a second set of contexts and communicators on GPU 0."""
    import glob

    from ddlcourse import checks
    for path in sorted(glob.glob("notebooks/*.ipynb") + glob.glob("labs/*.ipynb")):
        info = checks.notebook_clusters(path, "cluster")
        together = [c for c in info["clusters"] if c["alive_with"]]
        assert not together, f"{path} starts a cluster while another is alive: {together}; count it in plan.OVERHEADS"
    # the notebook's own kernel, and the kernels of notebooks 10 and 23 left running
    assert plan.overheads("sync_batchnorm", "cluster").contexts == 1 + len(plan.KERNELS_ON_GPU0)


def test_compiled_copy_and_traffic_measurement_are_counted():
    prof = dict(plan.overheads("profiling", "cluster").copies)
    e = plan.plan_section("profiling", "cluster").gpu
    assert prof["compiled copy (torch.compile)"] >= e.weights + e.grads
    s = config.sizes("expert_parallel", "cluster")
    traffic = plan.moe_traffic_bytes(s.sweep_tokens, s.n_ranks, s.dim, s.hidden, s.experts_per_rank, s.top_k)
    # at least the whole token set every rank builds, forward and backward
    assert traffic >= 2 * s.sweep_tokens * s.n_ranks * s.dim * 4
    ep = plan.plan_section("expert_parallel", "cluster").gpu
    assert ep.gpu_total >= traffic + plan.CUDA_OVERHEAD


def test_overheads_grow_the_total_past_the_old_planner():
    """Lab 4's 1-rank point with its whole global batch at once (micro_batches 1) fits a T4 without the overheads,
    not with them: the cluster profile splits it into micro-batches."""
    old = dict(config.PROFILES["lab_driving"]["cluster"], micro_batches=1)
    s = config.sizes("lab_driving", "cluster", **old)
    ests = [plan.estimate("lab_driving", w) for w in plan._driving(s)]
    worst = max(ests, key=lambda e: e.gpu_total)
    assert worst.gpu_total <= plan.GPU_BUDGET                                  # the old planner's verdict
    ov = plan.overheads("lab_driving", "cluster", ests)
    assert worst.gpu_total + ov.bytes > plan.GPU_BUDGET                        # what GPU 0 really holds
    assert plan.plan_section("lab_driving", "cluster").gpu.gpu_total <= plan.GPU_BUDGET


def test_the_budget_is_the_smallest_card_not_its_nominal_size():
    """Lab 3 on the old 64x128 grid fit the nominal 16 GiB of a 16 GB card, not the 14.75 GiB CUDA gives a process
    on a T4 (the smallest card the course supports): the cluster profile's grid is smaller."""
    assert plan.GPU_BUDGET < 15 * plan.GiB
    s = config.sizes("topology", "cluster", ny=64, nx=128)
    ests = [plan.estimate("topology", w) for w in plan._topology(s)]
    ov = plan.overheads("topology", "cluster", ests)
    worst = max(e.gpu_total for e in ests) + ov.bytes
    assert plan.GPU_BUDGET < worst
    assert plan.plan_section("topology", "cluster").gpu.gpu_total <= plan.GPU_BUDGET
    assert "14.75 GiB per GPU (what CUDA gives a process on a 16 GB T4" in plan.FOOTER


# --------------------------------------------------------------------------- grid lines, send/recv pairs, kernels
def _code(path: str, marker: str) -> str:
    """The source of the one code cell of ``path`` that holds ``marker``."""
    found = [cell_source(c) for c in notebook_cells(ROOT / path)
             if c["cell_type"] == "code" and marker in cell_source(c)]
    assert len(found) == 1, (path, marker, len(found))
    return found[0]


def test_the_lab_layouts_the_planner_counts_are_the_notebooks():
    layouts = _code("labs/04_driving.ipynb", "layouts = {")
    assert tuple(sorted(int(m) for m in re.findall(r"\bmp=(\d+)", layouts))) == plan.DRIVING_MESHES
    big = _code("labs/02_seismic.ipynb", "bigrun = dict(")
    call = ast.parse(big).body[0].value                                       # bigrun = dict(...)
    given = {k.arg: k.value.value for k in call.keywords if isinstance(k.value, ast.Constant)}
    assert {k: given[k] for k in plan.SEISMIC_BIG_RUN} == plan.SEISMIC_BIG_RUN
    runs = [(int(r), int(s)) for r, s in re.findall(r"dict\(ranks=(\d+), spatial=(\d+)\)", big)]
    assert tuple(runs) == plan.SEISMIC_SPATIAL_RUNS


@pytest.mark.parametrize("section", ["lab_seismic", "lab_driving"])
def test_grid_lines_through_rank_0_are_the_groups_grid_makes(section):
    """On 4 CPU ranks, the runs of the lab's notebook are set up for real (training.setup: a subgroup per scaling
    point, the dp x mp grid of each layout); the rank lines through rank 0 that ddlcourse.grid made are the
    communicators the planner counts besides the world's."""
    out = json.loads(run_ranks(4, "plan_grid_lines", section).stdout.strip().splitlines()[-1])
    assert sorted(out) == sorted(plan.overheads(section, "smoke").groups[1:]), out


def test_unbatched_send_recv_opens_a_pair_of_its_own():
    """The modules whose send/recv go one by one (a pair communicator each) are the ones the planner gives pairs;
    the batched ones (batch_isend_irecv: the group's communicator) get none."""
    from pathlib import Path
    src = {m: Path(plan.__file__).parents[1].joinpath("parallel", f"{m}.py").read_text()
           for m in ("model_parallel", "branches", "spatial", "context")}
    for m in ("model_parallel", "branches"):
        assert re.search(r"tdist\.i?send\(", src[m]) and "batch_isend_irecv" not in src[m], m
    for m in ("spatial", "context"):
        assert "batch_isend_irecv" in src[m] and not re.search(r"tdist\.i?send\(", src[m]), m
    assert plan.overheads("model_parallel", "cluster").pairs == plan.overheads("pipeline", "cluster").pairs == 1
    assert plan.overheads("lab_driving", "cluster").pairs == len(plan.DRIVING_MESHES)
    assert plan.overheads("tensor_spatial_sharded", "cluster").pairs == 0
    assert plan.overheads("context_parallel", "cluster").pairs == 0
    one = plan.overheads("model_parallel", "cluster")
    assert one.nccl_bytes == plan.Overheads(one.groups).nccl_bytes + plan.NCCL_COMM_BYTES


@pytest.mark.parametrize("section", [s for s in plan.SECTIONS
                                     if s not in ("sgd", "batch_size", "memory", "data_pipeline")])
def test_kernels_left_running_on_gpu_0_are_counted_everywhere(section):
    """JupyterLab keeps a kernel until it is shut down: those of notebooks 10 and 23 trained on cuda:0 and keep
    their context and cached tensors there while every other notebook runs."""
    ov = plan.overheads(section, "cluster")
    others = [s for s in plan.KERNELS_ON_GPU0 if s != section]
    base = {"profiling": 2}.get(section, 1)                 # the notebook's own kernel (and notebook 24's job)
    assert ov.contexts == base + len(others)
    copies = dict(ov.copies)
    for other, (notebook, _) in plan.KERNELS_ON_GPU0.items():
        assert copies[f"notebook {notebook}'s kernel left running"] == plan.kernel_bytes(other, "cluster") > 0


@pytest.mark.parametrize("section", [s for s in plan.SECTIONS])
def test_every_cluster_row_fits_with_the_overheads(section):
    row = plan.plan_section(section, "cluster")
    assert not row.overshoot(), row.overshoot()
    if not row.gpu.on_host:
        assert row.gpu.overhead >= plan.NCCL_SOLO_BYTES + plan.CUDA_CONTEXT_BYTES
