"""ddlcourse: the package behind the course *Distributed Deep Learning on HPC*.

Every notebook and lab imports from here; ipyparallel engines import the same functions.

Modules
-------
config   scale profiles (smoke / laptop / cluster), chosen by $DDLCOURSE_SCALE
cluster  start and stop an ipyparallel cluster of MPI engines
dist     per-rank setup: torch.distributed, Horovod, device, seeding
bench    step timing, throughput, speedup, efficiency and their plots
checks   environment checks (the allreduce three ways of notebook 00)
"""
import importlib.metadata as md
import platform

from ddlcourse import config

__version__ = "0.1.0"


def versions() -> dict:
    """Versions of the packages the course runs on (None where missing)."""
    out = {"python": platform.python_version()}
    for pkg in ("torch", "mpi4py", "mpich", "horovod", "ipyparallel", "jupyterlab", "matplotlib", "numpy", "nbval"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    out["ddlcourse"] = __version__
    return out


def print_versions() -> None:
    """The first code cell of every notebook: what this run uses, and at which scale."""
    v = versions()
    print("  ".join(f"{k} {val}" for k, val in v.items() if val is not None))
    print(f"scale profile: {config.get_scale()}  (set DDLCOURSE_SCALE=smoke|laptop|cluster)")
