"""The planner counts what GPU 0 holds besides a workload: NCCL communicators (world, subgroups, mesh dimensions,
Horovod's), other CUDA contexts (notebook kernel, a second cluster, a job beside the engines), second copies
(notebook 24's compiled model, notebook 22's traffic measurement). Each test fails on the planner that left them out."""
import pytest

from ddlcourse import config
from ddlcourse.tools import plan


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
    maize, seismic = plan.overheads("lab_maize", "cluster"), plan.overheads("lab_seismic", "cluster")
    assert maize.communicators == seismic.communicators + 1                    # Horovod runs in lab 1 only
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
    assert plan.overheads("sync_batchnorm", "cluster").contexts == 1          # only the notebook kernel


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
    """Lab 4's 1-rank point at the old cluster batch (128) fit 16 GiB without the overheads, not with them."""
    old = dict(config.PROFILES["lab_driving"]["cluster"], global_batch=128)
    s = config.sizes("lab_driving", "cluster", **old)
    ests = [plan.estimate("lab_driving", w) for w in plan._driving(s)]
    worst = max(ests, key=lambda e: e.gpu_total)
    assert worst.gpu_total <= plan.GPU_BUDGET                                  # the old planner's verdict
    ov = plan.overheads("lab_driving", "cluster", ests)
    assert worst.gpu_total + ov.bytes > plan.GPU_BUDGET                        # what GPU 0 really holds


@pytest.mark.parametrize("section", [s for s in plan.SECTIONS])
def test_every_cluster_row_fits_with_the_overheads(section):
    row = plan.plan_section(section, "cluster")
    assert not row.overshoot(), row.overshoot()
    if not row.gpu.on_host:
        assert row.gpu.overhead >= plan.NCCL_SOLO_BYTES + plan.CUDA_CONTEXT_BYTES
