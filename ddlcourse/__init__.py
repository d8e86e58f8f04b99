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
import atexit
import gc
import importlib.metadata as md
import platform

from ddlcourse import config

__version__ = "0.1.0"

# Leave quickly. At exit CPython collects every reference cycle of every object once more; with torch loaded
# that took 0.8-1.0 s per process on a 2-core machine, and 0.2 s with the objects frozen first (gc.freeze
# excludes them from the collection). Every rank, engine and course command pays it, so a 2-engine cluster's
# stop waited for it too (env/bench_cluster.py). Registered first, it runs after every other exit handler;
# reference counting still closes files and runs ordinary destructors.
atexit.register(gc.freeze)


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
