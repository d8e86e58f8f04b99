"""ddlcourse: the package behind the course *Distributed Deep Learning on HPC*.

Every notebook and lab imports from here; ipyparallel engines import the same functions. The package has six
layers, from the bottom up; a module imports only from its own layer and the layers below it (runtime <- core <-
mechanisms <- experiments <- exercises <- tools; tests/test_layers.py checks every import). A folder is one layer.

Modules
-------
runtime: the cluster the notebooks run on; it teaches nothing
  cluster/            start and stop an ipyparallel cluster of MPI engines, and know where each rank runs
core: what every rank sets up first
  config              scale profiles (smoke / laptop / cluster), chosen by $DDLCOURSE_SCALE, and every size read from them
  dist                per-rank setup: ranks from MPI, torch.distributed, Horovod, the seed, on_first_ranks
  grid                the one place where process groups and MPI communicators are made (named axes dp, tp, pp, ...)
  device              the rank's device, and clocks that wait for it
mechanisms: what the course teaches, as code that runs on the ranks
  parallel/           the parallelism schemes: data, model, pipeline, tensor, sequence, context, expert, spatial, sharded
  collectives         ring allreduce, recursive doubling and reduce+bcast from scratch on mpi4py; the alpha-beta model
  optim               learning-rate rules for large batches, and the optimizers the course compares
  losses              a loss that means the same on 1 and on N ranks
  metrics             metrics computed correctly across ranks
  sharding            which samples each rank trains on: a correct sharded sampler
  memory              where training memory goes, predicted and measured (SavedTensors)
  storage             sharded files on disk, and many ranks reading one file
  hardware            the hardware figures the course uses, with their sources
  models/             models the learner can read, small at smoke and laptop scale
  data/               data generators: nothing is downloaded
  physics/            physics solvers that make the ground truth of the case studies
experiments: what the notebooks run and plot, each against its serial reference where there is one
  experiments/        the notebooks' experiments on the mechanisms of parallel/, one module per mechanism
  sgd                 notebook 01: gradient descent you can watch
  noise_scale         notebook 02: gradient noise scale, accumulation, a batch-size sweep
  integrity           notebook 03: the same loss trajectory on 1 and N ranks, and seven classic mistakes
  checks              notebook 00 and `check`: MPI, torch.distributed and Horovod agree; where each rank runs
  runtimes            notebooks 07 and 08: gloo against MPI, bus bandwidth, the hierarchical allreduce
  federated           notebook 10: federated averaging over non-IID "devices"
  bench               step timing, throughput, speedup and efficiency, and their plots (notebook 13, the labs)
  synthetic_bench     notebook 13: a synthetic-data throughput benchmark
  amp                 notebook 23: bf16 and fp16 autocast, loss scaling, fp32 master weights
  profiling           notebook 24: traces per rank, the straggler, exposed communication, Horovod's timeline
  elastic             notebook 25: checkpoints, resume, torchrun's elastic restarts
  dcp                 notebook 26: FSDP2 and DTensor on a 2-D DeviceMesh, DCP checkpoints resharded
  datapipe            notebook 27: a sharded on-disk format and the input pipeline measured
  hpsearch            notebook 28: random search and successive halving on a load-balanced view
  perfmodel           notebook 29: a scaling model calibrated on published points
  layout              notebook 30: memory and traffic per rank of a transformer on a DP x TP x PP x CP x EP grid
  plots_timeline      plots of timelines, memory bars, bubbles and curves
  plots_transformer   plots of the transformer-parallelism notebooks
  training/           the skeleton every case study is built on: config, command line, run context, checkpoints
  cases/              the four case studies of the labs: maize, seismic, topology, driving
exercises: the learner's coding exercises and their checkers
  selfcheck           check(...) and check_code(...): the verdicts the notebooks print
  exercises/          by topic: the checkers, the reference solutions, the learner's templates, the terminal;
                      the rehearsal of a distributed check on simulated ranks, and planted mistakes
tools: for instructors and sites; every tool is a command of python -m ddlcourse
  tools/              the memory planner and the benchmarks
  __main__            python -m ddlcourse <command>: the one command line
"""
import atexit
import gc
import importlib.metadata as md
import inspect
import platform
import textwrap

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


def show(obj, start: str | None = None, stop: str | None = None) -> str:
    """Print the real source of a function, class or module of the package (its lines from the first that contains
    ``start`` to the first after it that contains ``stop``, both included), with their file and line numbers; a
    notebook shows package code this way, never as a copy that could drift from it. Returns the lines printed."""
    lines, first = inspect.getsourcelines(obj)
    text = [line.rstrip("\n") for line in lines]
    a = next((i for i, line in enumerate(text) if start in line), None) if start else 0
    if a is None:
        raise ValueError(f"no line of {getattr(obj, '__qualname__', obj)} contains {start!r}")
    b = next((i for i, line in enumerate(text[a:], a) if stop in line), None) if stop else len(text) - 1
    if b is None:
        raise ValueError(f"no line of {getattr(obj, '__qualname__', obj)} after {start!r} contains {stop!r}")
    where = inspect.getsourcefile(obj) or "?"
    where = where[where.rfind("ddlcourse/"):] if "ddlcourse/" in where else where
    body = textwrap.dedent("\n".join(text[a:b + 1]))
    print(f"# {where}, lines {first + a}-{first + b}\n{body}")
    return body

