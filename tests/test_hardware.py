"""ddlcourse.hardware: the course's one table of hardware figures, per direction, each with a source; the
modules that model links take theirs from it."""
from ddlcourse import hardware, layout, runtimes


def test_every_figure_has_a_source_and_links_are_per_direction():
    for row in hardware.table():
        assert row["source"], row
    pcie5 = hardware.LINKS["PCIe5 x16"]
    assert pcie5.per_direction == 64e9 and pcie5.both_ways == 128e9     # datasheets print the sum
    assert hardware.GPUS["H100-SXM"].nvlink == 450e9                    # 900 GB/s both directions
    assert hardware.GPUS["A100-SXM"].nvlink == 300e9


def test_the_models_use_the_table():
    import inspect
    defaults = inspect.signature(layout.step_seconds).parameters
    assert defaults["flops"].default == hardware.GPUS["H100-SXM"].bf16_flops
    assert defaults["intra_bw"].default == hardware.GPUS["H100-SXM"].nvlink
    assert defaults["inter_bw"].default == hardware.LINKS["NDR IB"].per_direction
    assert runtimes.H100_NVLINK.bandwidth == hardware.GPUS["H100-SXM"].nvlink
    assert runtimes.NDR_PER_GPU.bandwidth == hardware.LINKS["NDR IB"].per_direction
