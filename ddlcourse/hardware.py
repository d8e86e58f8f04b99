"""The hardware figures the course uses, once, with their sources.

Every bandwidth here is **per direction** (what one sender can push to one receiver at a time), the figure the
alpha-beta models of notebooks 04, 08, 29 and 30 need. Vendors often quote both directions added together;
``both_ways`` says what the datasheet's headline number is. Compute is dense (no sparsity) tensor-core
throughput. These are datasheet peaks: measured bandwidths are lower, so a model that uses them gives a lower
bound on time.

>>> from ddlcourse import hardware
>>> hardware.GPUS["H100-SXM"].nvlink / 1e9
450.0
"""
from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_flops: float      # dense BF16/FP16 tensor-core FLOP/s
    memory: float          # bytes of HBM
    hbm: float             # bytes/s of HBM bandwidth
    nvlink: float          # bytes/s per direction, per GPU, to the NVLink/NVSwitch fabric
    source: str


@dataclass(frozen=True)
class LinkSpec:
    name: str
    per_direction: float   # bytes/s one way
    source: str

    @property
    def both_ways(self) -> float:
        """The figure datasheets often print: both directions added together."""
        return 2 * self.per_direction


GPUS = {
    "V100-SXM2": GPU("V100-SXM2", 125e12, 32 * GB, 900 * GB, 150 * GB,
                     "NVIDIA Tesla V100 datasheet: 125 TFLOPS tensor, NVLink 300 GB/s (both directions, 6 links)"),
    "A100-SXM": GPU("A100-SXM", 312e12, 80 * GB, 2039 * GB, 300 * GB,
                    "NVIDIA A100 Tensor Core GPU datasheet: 312 TFLOPS BF16 dense, NVLink 600 GB/s (both directions)"),
    "H100-SXM": GPU("H100-SXM", 989e12, 80 * GB, 3350 * GB, 450 * GB,
                    "NVIDIA H100 Tensor Core GPU datasheet: 989 TFLOPS BF16 dense (1979 with sparsity), "
                    "NVLink 900 GB/s (both directions)"),
}

LINKS = {
    "PCIe4 x16": LinkSpec("PCIe4 x16", 32 * GB, "PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes, ~32 GB/s each way (64 both)"),
    "PCIe5 x16": LinkSpec("PCIe5 x16", 64 * GB, "PCI-SIG PCIe 5.0: 32 GT/s x 16 lanes, ~64 GB/s each way (128 both)"),
    "HDR IB": LinkSpec("HDR IB", 200e9 / 8, "InfiniBand HDR: 200 Gb/s per port each way (25 GB/s)"),
    "NDR IB": LinkSpec("NDR IB", 400e9 / 8, "NVIDIA ConnectX-7 / InfiniBand NDR: 400 Gb/s per port each way (50 GB/s); "
                       "a DGX H100 has one per GPU (NVIDIA DGX H100 datasheet)"),
}


def table() -> list[dict]:
    """Every figure as a row (for a notebook to print or plot)."""
    rows = [dict(kind="GPU", name=g.name, bf16_tflops=g.bf16_flops / 1e12, memory_gb=g.memory / GB,
                 nvlink_gbs_per_direction=g.nvlink / GB, source=g.source) for g in GPUS.values()]
    rows += [dict(kind="link", name=l.name, gbs_per_direction=l.per_direction / GB, gbs_both_ways=l.both_ways / GB,
                  source=l.source) for l in LINKS.values()]
    return rows
