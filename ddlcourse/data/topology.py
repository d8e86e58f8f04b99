"""Topology-optimisation data set: random loads, supports and volume fractions, solved by SIMP.

Each sample is one compliance problem on a ``(ny, nx)`` grid (or ``(nz, ny, nx)`` in 3D):

* **supports** (2D): ``0`` cantilever (left edge clamped), ``1`` clamped at both ends, ``2`` simply supported
  (pin at the bottom-left corner, roller at the bottom-right); 3D: the face x = 0 clamped;
* **load**: a unit point load at a random node, in a random direction;
* **volume fraction** uniform in ``[vf_min, vf_max]``.

The random draws are made in *normalised* coordinates (positions in [0, 1]), so the same seed gives the
same physical problems at any resolution: that is how the lab tests resolution transfer (train coarse,
evaluate fine). The filter radius is given in elements at the base resolution and scales with the grid.

Inputs are channels on the element grid, what a U-Net reads (2D: 5 channels, 3D: 7)::

    [volfrac, f_x, f_y(, f_z), fixed_x, fixed_y(, fixed_z)]        # (channels, ny, nx)

``f`` is the load's unit direction on the elements touching the loaded node; ``fixed_k`` is 1 on elements
touching a node whose displacement k is fixed. The target is SIMP's final physical density ``(ny, nx)``.

Generation is seeded, sharded by rank (chunks of ``chunk_size`` problems, round-robin) and cached on disk
by :mod:`ddlcourse.data.cache`, keyed by a hash of :data:`VERSION` and the settings.
"""
from __future__ import annotations

import time

import numpy as np

from ddlcourse import dist
from ddlcourse.data import cache
from ddlcourse.physics import simp

VERSION = "topology-v1"
SUPPORTS_2D = ("cantilever", "clamped-clamped", "simply-supported")
PARAMS = ("support", "u", "v", "w", "angle", "elevation", "volfrac")   # columns of ``params``


def make_settings(shape, n_items: int, seed: int = 0, chunk_size: int = 8, maxloop: int = 40,
                  rmin: float = 1.5, base_nx: int | None = None, vf_min: float = 0.3, vf_max: float = 0.5) -> dict:
    """Settings of a data set (everything that changes the data is here, so it keys the cache).

    ``base_nx``: the grid width that ``rmin`` refers to (default: this grid's); a grid twice as wide gets a
    filter twice as wide, so the designs keep the same physical feature size.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (2, 3) or min(shape) < 2:
        raise cache.DataError(f"shape must be (ny, nx) or (nz, ny, nx) with sizes >= 2, got {shape}")
    if not 0 < vf_min <= vf_max < 1:
        raise cache.DataError(f"need 0 < vf_min <= vf_max < 1, got {vf_min}, {vf_max}")
    if maxloop < 1 or rmin <= 0:
        raise cache.DataError(f"need maxloop >= 1 and rmin > 0, got {maxloop}, {rmin}")
    base_nx = int(base_nx or shape[-1])
    return dict(shape=list(shape), n_items=int(n_items), seed=int(seed), chunk_size=int(chunk_size),
                maxloop=int(maxloop), rmin=float(rmin) * shape[-1] / base_nx, vf_min=float(vf_min),
                vf_max=float(vf_max))


# --------------------------------------------------------------------------- random problems
def sample_params(rng: np.random.Generator, n: int, vf_min: float, vf_max: float) -> np.ndarray:
    """``(n, 7)`` physical parameters, independent of the resolution (see :data:`PARAMS`)."""
    p = np.empty((n, len(PARAMS)))
    p[:, 0] = rng.integers(0, len(SUPPORTS_2D), n)
    p[:, 1:4] = rng.uniform(0.0, 1.0, (n, 3))              # load position (x, y, z) in [0, 1]
    p[:, 4] = rng.uniform(0.0, 2 * np.pi, n)               # direction: angle in the x-y plane
    p[:, 5] = rng.uniform(-0.5 * np.pi, 0.5 * np.pi, n)    # and elevation (3D only)
    p[:, 6] = rng.uniform(vf_min, vf_max, n)
    # keep the load off the supported edges and corners: a load on a fixed node does nothing
    cant = p[:, 0] == 0
    p[cant, 1] = 0.25 + 0.75 * p[cant, 1]
    p[~cant, 1] = 0.1 + 0.8 * p[~cant, 1]
    return p


def _direction(par: np.ndarray, dim: int) -> np.ndarray:
    ang, elev = par[4], par[5]
    if dim == 2:
        return np.array([np.cos(ang), np.sin(ang)])
    return np.array([np.cos(ang) * np.cos(elev), np.sin(ang) * np.cos(elev), np.sin(elev)])


def _load_node(par: np.ndarray, shape) -> tuple:
    """Array index of the loaded node: positions (x, y, z) -> (iz, iy, ix)."""
    ns = simp.node_shape(shape)
    pos = par[1:1 + len(shape)][::-1]                       # (z, y, x) or (y, x) order
    return tuple(int(round(q * (n - 1))) for q, n in zip(pos, ns))


def problem_from_params(par: np.ndarray, shape) -> simp.Problem:
    """The :class:`~ddlcourse.physics.simp.Problem` of one parameter row on a grid of ``shape``."""
    shape = tuple(int(s) for s in shape)
    dim = len(shape)
    f = np.zeros(simp.n_dofs(shape))
    f[simp.node_dofs(shape, _load_node(par, shape))] = _direction(par, dim)
    all_ = slice(None)
    if dim == 3:
        fixed = simp.node_dofs(shape, (all_, all_, 0))
    else:
        ny, nx = shape
        kind = int(par[0])
        if kind == 0:
            fixed = simp.node_dofs(shape, (all_, 0))
        elif kind == 1:
            fixed = np.concatenate([simp.node_dofs(shape, (all_, 0)), simp.node_dofs(shape, (all_, nx))])
        else:
            fixed = np.concatenate([simp.node_dofs(shape, (ny, 0)), simp.node_dofs(shape, (ny, nx), axes=1)])
    return simp.Problem(shape, f, fixed, float(par[6]))


# --------------------------------------------------------------------------- encoding as channels
def _nodes_to_elements(a: np.ndarray, reduce) -> np.ndarray:
    """A nodal field ``(..., ny+1, nx+1)`` to elements: ``reduce`` over each element's corners."""
    dim = a.ndim
    corners = [a[tuple(slice(o, a.shape[k] - 1 + o) for k, o in enumerate(off))]
               for off in simp.local_nodes(dim)]
    return reduce(np.stack(corners), axis=0)


def encode(problem: simp.Problem) -> np.ndarray:
    """Input channels ``(2 * dim + 1, *shape)`` of a problem, float32 (see the module docstring)."""
    shape, dim = problem.shape, problem.dim
    ns = simp.node_shape(shape)
    force = problem.force.reshape(*ns, dim)                  # DOF d*node + k -> (..., k)
    fixed = np.zeros(simp.n_dofs(shape), bool)
    fixed[problem.fixed] = True
    fixed = fixed.reshape(*ns, dim)
    chans = [np.full(shape, problem.volfrac)]
    for k in range(dim):     # signed load: the sum over corners is the nodal value (one loaded node)
        chans.append(_nodes_to_elements(force[..., k], np.sum))
    for k in range(dim):
        chans.append(_nodes_to_elements(fixed[..., k].astype(float), np.max))
    return np.stack(chans).astype(np.float32)


# --------------------------------------------------------------------------- generation
def make_chunk(settings: dict, chunk_id: int, n: int, rng: np.random.Generator) -> dict:
    """Solve ``n`` random problems: inputs ``(n, C, *shape)``, target ``(n, *shape)``, compliance, params."""
    shape = tuple(settings["shape"])
    params = sample_params(rng, n, settings["vf_min"], settings["vf_max"])
    xs, ys, cs, its = [], [], [], []
    for par in params:
        prob = problem_from_params(par, shape)
        res = simp.optimize(prob, rmin=settings["rmin"], maxloop=settings["maxloop"])
        xs.append(encode(prob))
        ys.append(res.xphys.astype(np.float32))
        cs.append(res.compliance)
        its.append(res.n_iter)
    return dict(inputs=np.stack(xs), target=np.stack(ys), compliance=np.asarray(cs),
                params=params, n_iter=np.asarray(its, np.int32))


def load(settings: dict, rank: int = 0, world_size: int = 1, use_cache: bool = True, root=None) -> dict:
    """This rank's shard of the data set (made or read from the cache); adds ``seconds`` spent."""
    t0 = time.perf_counter()
    out = cache.load_or_make("topology", VERSION, settings,
                             lambda cid, n, rng: make_chunk(settings, cid, n, rng),
                             rank=rank, world_size=world_size, use_cache=use_cache, root=root)
    out["seconds"] = time.perf_counter() - t0
    return out


def generate_on_rank(settings: dict, use_cache: bool = True) -> dict:
    """Called on every engine (``c.run(generate_on_rank, settings)``): make this MPI rank's shard.

    Returns a small summary (the arrays stay on the engine's disk cache): rank, samples, seconds, mean iterations,
    and how many problems SIMP solved to convergence before ``settings["maxloop"]`` stopped it.
    """
    d = load(settings, dist.rank(), dist.world_size(), use_cache=use_cache)
    return dict(rank=dist.rank(), samples=len(d["target"]), seconds=round(d["seconds"], 2),
                mean_iterations=float(d["n_iter"].mean()),
                converged=int((d["n_iter"] < settings["maxloop"]).sum()))


def gather(settings: dict, comm=None, use_cache: bool = True) -> dict:
    """The whole data set on every rank: each rank makes its shard, then the shards are exchanged.

    Sample ``i`` of the result is the same whatever the number of ranks (chunks are put back in order).
    """
    if comm is None:
        return load(settings, use_cache=use_cache)
    r, n = comm.Get_rank(), comm.Get_size()
    mine = load(settings, r, n, use_cache=use_cache)
    cs, total = settings["chunk_size"], settings["n_items"]
    ids = cache.chunks_of_rank(total, cs, r, n)
    pieces = {}
    start = 0
    for cid in ids:                                    # split my concatenated shard back into chunks
        k = cache.chunk_items(cid, total, cs)
        pieces[cid] = {key: v[start:start + k] for key, v in mine.items() if key != "seconds"}
        start += k
    allp = {}
    for part in comm.allgather(pieces):
        allp.update(part)
    keys = allp[0].keys()
    out = {key: np.concatenate([allp[c][key] for c in sorted(allp)]) for key in keys}
    out["seconds"] = mine["seconds"]
    return out
