"""SIMP topology optimisation: minimise compliance under a volume constraint, in 2D and 3D.

The formulation is the one of the 88-line code (Andreassen et al. 2011) and of top3d (Liu & Tovar 2014):

* a structured grid of unit elements, bilinear 4-node quads (2D, plane stress) or trilinear 8-node
  hexahedra (3D); Young's modulus ``E(x) = Emin + x**p * (E0 - Emin)`` with ``p = 3``, ``Emin = 1e-9``;
* sparse assembly of ``K(x)`` and a sparse solve of ``K u = f`` on the free degrees of freedom;
* a density filter (default) or a sensitivity filter of radius ``rmin`` (linear "hat" weights);
* the optimality-criteria (OC) update, with bisection on the Lagrange multiplier of the volume constraint.

Written for speed with NumPy/SciPy only (no loops over elements):

* the element stiffness matrix comes from 2x2(x2) Gauss quadrature (no hard-coded table);
* the sparsity pattern of ``K`` on the free DOFs is built once; each iteration fills its values with one
  sparse mat-vec ``data = M @ E`` (``M`` maps element moduli to the nonzeros of ``K``);
* the filter is a correlation with a small kernel (``scipy.ndimage``), identical to the ``H`` matrix of
  the papers (``H`` is symmetric, so its transpose in the chain rule is the same correlation).

Array conventions (C order, what a CNN sees):

* densities have shape ``(ny, nx)`` in 2D and ``(nz, ny, nx)`` in 3D; row index ``iy`` grows downward;
* nodes have shape ``(ny+1, nx+1)`` / ``(nz+1, ny+1, nx+1)``; node id = its C-order flat index;
* DOF ``d * node + k`` is the displacement of ``node`` along axis ``k`` (``0: x, 1: y, 2: z``), ``d`` = dim.
"""
from __future__ import annotations

import ctypes
import itertools
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy import ndimage

E0, EMIN, NU, PENAL = 1.0, 1e-9, 0.3, 3.0
FILTERS = ("density", "sensitivity")
SOLVERS = ("auto", "banded", "direct", "cg")


# --------------------------------------------------------------------------- BLAS threads
def limit_blas_threads(n: int = 1) -> int:
    """Set the thread count of every OpenBLAS loaded in this process (NumPy's and SciPy's); returns how many.

    One rank solves one small banded system at a time: extra BLAS threads only fight the other ranks for the
    cores (measured: a 4k-DOF banded solve took 0.43 s with default threads on 2 busy cores, 0.03 s with one).
    ``threadpoolctl`` does this in general; it is not in the course environment, so this is its small core.
    """
    found = 0
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line.split()[-1]}
    except OSError:          # not Linux: leave the threads alone
        return 0
    for lib in sorted(libs):
        try:
            handle = ctypes.CDLL(lib)
        except OSError:
            continue
        for name in ("openblas_set_num_threads", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "scipy_openblas_set_num_threads64_"):
            fn = getattr(handle, name, None)
            if fn is not None:
                fn(int(n))
                found += 1
                break
    return found


# --------------------------------------------------------------------------- geometry of the grid
def _check_shape(shape) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (2, 3) or min(shape) < 1:
        raise ValueError(f"shape must be (ny, nx) or (nz, ny, nx) with positive sizes, got {shape}")
    return shape


def node_shape(shape) -> tuple[int, ...]:
    return tuple(s + 1 for s in _check_shape(shape))


def n_dofs(shape) -> int:
    shape = _check_shape(shape)
    return len(shape) * int(np.prod(node_shape(shape)))


def local_nodes(dim: int) -> np.ndarray:
    """Corner offsets of one element in array order, ``(2**dim, dim)``.

    2D: (iy, ix) = (0,0), (0,1), (1,1), (1,0), counter-clockwise in (x, y); 3D: that face at iz = 0, then iz = 1.
    """
    face = np.array([(0, 0), (0, 1), (1, 1), (1, 0)])
    if dim == 2:
        return face
    return np.array([(z, y, x) for z in (0, 1) for y, x in face])


def element_dofs(shape) -> np.ndarray:
    """Global DOFs of every element, ``(n_elements, dim * 2**dim)``, in local-node order then axis x, y, z."""
    shape = _check_shape(shape)
    dim = len(shape)
    nodes = np.arange(int(np.prod(node_shape(shape)))).reshape(node_shape(shape))
    corners = []
    for off in local_nodes(dim):
        sl = tuple(slice(o, o + s) for o, s in zip(off, shape))
        corners.append(nodes[sl].ravel())
    corner_nodes = np.stack(corners, axis=1)                     # (n_elements, 2**dim)
    # DOF of axis k: x is the last array axis, so axis k of the physics is dof offset k.
    dofs = dim * corner_nodes[:, :, None] + np.arange(dim)        # (n_elements, 2**dim, dim)
    return dofs.reshape(len(corner_nodes), -1)


def node_dofs(shape, node_index, axes=None) -> np.ndarray:
    """DOFs of the nodes at array index ``node_index`` (a tuple of ints/slices/arrays) along ``axes`` (0=x,1=y,2=z)."""
    shape = _check_shape(shape)
    dim = len(shape)
    nodes = np.arange(int(np.prod(node_shape(shape)))).reshape(node_shape(shape))[node_index]
    axes = range(dim) if axes is None else np.atleast_1d(axes)
    return np.sort(np.concatenate([dim * np.ravel(nodes) + int(a) for a in axes]))


# --------------------------------------------------------------------------- element stiffness
def elasticity_matrix(dim: int, nu: float = NU, E: float = E0) -> np.ndarray:
    """Isotropic constitutive matrix: plane stress in 2D (3x3), full 3D (6x6); engineering shear strains."""
    if dim == 2:
        return E / (1 - nu**2) * np.array([[1, nu, 0], [nu, 1, 0], [0, 0, (1 - nu) / 2]])
    lam, mu = E * nu / ((1 + nu) * (1 - 2 * nu)), E / (2 * (1 + nu))
    D = np.zeros((6, 6))
    D[:3, :3] = lam
    D[np.arange(3), np.arange(3)] += 2 * mu
    D[np.arange(3, 6), np.arange(3, 6)] = mu
    return D


def _strain_rows(dim: int):
    """Pairs (a, b) of each strain component: normal strains (a, a), then shears (a, b)."""
    normal = [(a, a) for a in range(dim)]
    shear = [(0, 1)] if dim == 2 else [(0, 1), (1, 2), (2, 0)]
    return normal + shear


def element_stiffness(dim: int, nu: float = NU) -> np.ndarray:
    """Stiffness of a unit Q4 (dim 2) or H8 (dim 3) element by 2-point Gauss quadrature per axis."""
    if dim not in (2, 3):
        raise ValueError(f"dim must be 2 or 3, got {dim}")
    corners = local_nodes(dim)[:, ::-1].astype(float)            # (n_nodes, dim) in (x, y, z) order
    n_nodes = len(corners)
    D = elasticity_matrix(dim, nu)
    g = 0.5 + 0.5 / np.sqrt(3) * np.array([-1.0, 1.0])           # Gauss points on [0, 1], weights 1/2
    KE = np.zeros((dim * n_nodes, dim * n_nodes))
    for p in itertools.product(g, repeat=dim):
        p = np.array(p)
        # shape function N_a = prod_k (c_ak p_k + (1 - c_ak)(1 - p_k)); its factor per axis and derivative
        fac = corners * p + (1 - corners) * (1 - p)               # (n_nodes, dim)
        dfac = 2 * corners - 1
        grad = np.empty((n_nodes, dim))                            # dN_a / dx_k
        for k in range(dim):
            grad[:, k] = dfac[:, k] * np.prod(np.delete(fac, k, axis=1), axis=1)
        B = np.zeros((len(_strain_rows(dim)), dim * n_nodes))
        for r, (a, b) in enumerate(_strain_rows(dim)):
            B[r, a::dim] += grad[:, b]
            if a != b:
                B[r, b::dim] += grad[:, a]
        KE += 0.5**dim * B.T @ D @ B
    return KE


# --------------------------------------------------------------------------- the problem
@dataclass
class Problem:
    """A compliance problem: grid ``shape``, load vector ``force`` (ndof,), ``fixed`` DOFs and the volume fraction."""
    shape: tuple
    force: np.ndarray
    fixed: np.ndarray
    volfrac: float
    name: str = ""

    def __post_init__(self):
        self.shape = _check_shape(self.shape)
        nd = n_dofs(self.shape)
        self.force = np.asarray(self.force, float).ravel()
        self.fixed = np.unique(np.asarray(self.fixed, int).ravel())
        if self.force.shape != (nd,):
            raise ValueError(f"force must have one entry per DOF ({nd}), got {self.force.shape}")
        if self.fixed.size == 0 or self.fixed.min() < 0 or self.fixed.max() >= nd:
            raise ValueError("fixed must list at least one DOF, all within [0, ndof)")
        if not 0 < self.volfrac <= 1:
            raise ValueError(f"volfrac must lie in (0, 1], got {self.volfrac}")
        free_load = self.force.copy()
        free_load[self.fixed] = 0.0
        if not np.any(free_load):
            raise ValueError("the load vector is zero on the free DOFs (or zero): there is nothing to optimise")

    @property
    def dim(self) -> int:
        return len(self.shape)


def mbb_beam(nelx: int = 60, nely: int = 20, volfrac: float = 0.5) -> Problem:
    """The half MBB beam of the 88-line paper: symmetry on the left edge, roller at the bottom right,
    unit load down at the top-left corner."""
    shape = (nely, nelx)
    f = np.zeros(n_dofs(shape))
    f[node_dofs(shape, (0, 0), axes=1)] = 1.0                      # +y is down in array order
    fixed = np.concatenate([node_dofs(shape, (slice(None), 0), axes=0),
                            node_dofs(shape, (nely, nelx), axes=1)])
    return Problem(shape, f, fixed, volfrac, name=f"MBB {nelx}x{nely}")


def cantilever_3d(nelx: int, nely: int, nelz: int, volfrac: float = 0.3) -> Problem:
    """The default problem of top3d/pytopo3d: face x = 0 clamped, unit loads along -z on the edge x = nelx, z = 0.

    In array order (nz, ny, nx) the top3d axes map as x -> ix, y -> iy, z -> iz.
    """
    shape = (nelz, nely, nelx)
    f = np.zeros(n_dofs(shape))
    f[node_dofs(shape, (0, slice(None), nelx), axes=2)] = -1.0
    fixed = node_dofs(shape, (slice(None), slice(None), 0))
    return Problem(shape, f, fixed, volfrac, name=f"cantilever {nelx}x{nely}x{nelz}")


# --------------------------------------------------------------------------- finite elements
def _banded_flops(shape) -> float:
    """Rough cost of a banded Cholesky on this grid: ndof * bandwidth**2."""
    ns = sorted(node_shape(shape))
    dim = len(ns)
    band = dim * (int(np.prod(ns[:-1])) + (int(np.prod(ns[:-2])) if dim == 3 else 0) + 1)
    return float(n_dofs(shape)) * band**2


class FEModel:
    """Assemble and solve ``K(x) u = f`` fast, for many densities on the same grid and supports."""

    def __init__(self, shape, fixed, nu: float = NU, solver: str = "auto"):
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
        self.shape = _check_shape(shape)
        self.dim, self.ndof = len(self.shape), n_dofs(self.shape)
        # A structured grid numbered along its shortest axes first has a narrow band: LAPACK's banded
        # Cholesky then beats SuperLU (measured 3x on 10x10x10, more in 2D). Very wide bands go to SuperLU.
        self.solver = ("banded" if _banded_flops(self.shape) < 5e9 else "direct") if solver == "auto" else solver
        self.KE = element_stiffness(self.dim, nu)
        self.edof = element_dofs(self.shape)                               # (n_el, nd)
        self.free = np.setdiff1d(np.arange(self.ndof), fixed)
        self._build_pattern()
        self._u_prev = None

    def _build_pattern(self) -> None:
        """``M`` (nnz, n_el): ``K_free.data = M @ E`` for the CSR pattern (indices, indptr) of K on free DOFs."""
        n_el, nd = self.edof.shape
        nf = len(self.free)
        reduced = np.full(self.ndof, -1, dtype=np.int64)
        reduced[self.free] = np.arange(nf)
        rd = reduced[self.edof]                                             # (n_el, nd), -1 = fixed
        rows = np.broadcast_to(rd[:, :, None], (n_el, nd, nd))
        cols = np.broadcast_to(rd[:, None, :], (n_el, nd, nd))
        keep = (rows >= 0) & (cols >= 0)
        key = rows[keep] * nf + cols[keep]
        uniq, inv = np.unique(key, return_inverse=True)
        el = np.broadcast_to(np.arange(n_el)[:, None, None], (n_el, nd, nd))[keep]
        ke = np.broadcast_to(self.KE[None], (n_el, nd, nd))[keep]
        self.M = sp.csr_matrix((ke, (inv, el)), shape=(len(uniq), n_el))
        self.indices = (uniq % nf).astype(np.int32)
        self.indptr = np.searchsorted(uniq // nf, np.arange(nf + 1)).astype(np.int32)
        self.nf = nf
        if self.solver == "banded":
            self._build_band()
            limit_blas_threads(1)

    def _build_band(self) -> None:
        """Order the free DOFs with the grid's shortest axis fastest (the narrowest band), and find where each
        upper-triangle nonzero goes in LAPACK's band storage."""
        ns = node_shape(self.shape)
        order = np.argsort(ns, kind="stable")[::-1]                         # longest axis slowest
        nodes = np.arange(int(np.prod(ns))).reshape(ns).transpose(order).ravel()
        dofs = (self.dim * nodes[:, None] + np.arange(self.dim)).ravel()     # DOFs in banded order
        reduced = np.full(self.ndof, -1, dtype=np.int64)
        reduced[self.free] = np.arange(self.nf)
        self.perm = reduced[dofs][reduced[dofs] >= 0]                        # banded position -> free DOF
        inv = np.empty_like(self.perm)
        inv[self.perm] = np.arange(self.nf)
        rows = inv[np.repeat(np.arange(self.nf), np.diff(self.indptr))]
        cols = inv[self.indices]
        self.upper = rows <= cols                                           # nonzeros kept (i <= j)
        self.bandwidth = int((cols - rows)[self.upper].max())
        # ab[u + i - j, j] = K[i, j] (scipy.linalg.solveh_banded, lower=False)
        self.band_pos = (self.bandwidth + rows - cols)[self.upper] * self.nf + cols[self.upper]

    def stiffness(self, xphys: np.ndarray, penal: float = PENAL) -> sp.csr_matrix:
        E = EMIN + np.ravel(xphys) ** penal * (E0 - EMIN)
        return sp.csr_matrix((self.M @ E, self.indices, self.indptr), shape=(self.nf, self.nf))

    def solve(self, xphys: np.ndarray, force: np.ndarray, penal: float = PENAL) -> np.ndarray:
        """Displacements ``u`` (ndof,), zero on the fixed DOFs."""
        if np.shape(xphys) != self.shape:
            raise ValueError(f"density has shape {np.shape(xphys)}, the grid is {self.shape}")
        K = self.stiffness(xphys, penal)
        f = force[self.free]
        if self.solver == "banded":
            ab = np.zeros((self.bandwidth + 1) * self.nf)
            ab[self.band_pos] = K.data[self.upper]
            uf = np.empty(self.nf)
            uf[self.perm] = sla.solveh_banded(ab.reshape(self.bandwidth + 1, self.nf), f[self.perm],
                                              check_finite=False)
        elif self.solver == "direct":
            uf = spla.spsolve(K, f, permc_spec="MMD_AT_PLUS_A")
        else:   # Jacobi-preconditioned CG, warm-started from the previous design's solution
            M = sp.diags(1.0 / K.diagonal())
            uf, info = spla.cg(K, f, x0=self._u_prev, rtol=1e-10, maxiter=20 * self.nf, M=M)
            if info != 0:
                raise RuntimeError(f"CG did not converge (info={info}); use solver='direct'")
            self._u_prev = uf
        u = np.zeros(self.ndof)
        u[self.free] = uf
        return u

    def element_energy(self, u: np.ndarray) -> np.ndarray:
        """``u_e^T KE u_e`` of every element for unit modulus, shaped like the grid."""
        ue = u[self.edof]                                                   # (n_el, nd)
        return np.einsum("ei,ij,ej->e", ue, self.KE, ue).reshape(self.shape)


def compliance(problem: Problem, xphys: np.ndarray, penal: float = PENAL, fe: FEModel | None = None) -> float:
    """Compliance ``f^T u`` of a given design (the physics metric of a predicted design)."""
    fe = fe or FEModel(problem.shape, problem.fixed)
    x = np.clip(np.asarray(xphys, float), 0.0, 1.0)
    u = fe.solve(x, problem.force, penal)
    return float(problem.force @ u)


# --------------------------------------------------------------------------- filter and OC update
class DensityFilter:
    """``H x / Hs`` with weights ``max(0, rmin - distance)`` between element centres (the papers' H matrix)."""

    def __init__(self, shape, rmin: float):
        if rmin <= 0:
            raise ValueError(f"rmin must be positive, got {rmin}")
        shape = _check_shape(shape)
        r = int(np.ceil(rmin)) - 1
        grids = np.meshgrid(*[np.arange(-r, r + 1)] * len(shape), indexing="ij")
        self.kernel = np.maximum(0.0, rmin - np.sqrt(sum(g**2 for g in grids)))
        self.Hs = self._correlate(np.ones(shape))

    def _correlate(self, a: np.ndarray) -> np.ndarray:
        return ndimage.correlate(a, self.kernel, mode="constant", cval=0.0)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self._correlate(x) / self.Hs

    def chain(self, dx: np.ndarray) -> np.ndarray:
        """Gradient through the filter: ``H^T (dx / Hs)`` (H is symmetric)."""
        return self._correlate(dx / self.Hs)


def oc_update(x, dc, dv, volfrac, physical, move: float = 0.2):
    """Optimality criteria with bisection on the multiplier; ``physical(x)`` maps design to physical density."""
    target = volfrac * x.size
    l1, l2 = 0.0, 1e9
    ratio = np.sqrt(np.maximum(0.0, -dc / dv))
    while l2 - l1 > 1e-3 * (l1 + l2):          # (the papers' test, safe when l2 reaches 0)
        lmid = 0.5 * (l1 + l2)
        xnew = np.clip(x * ratio / np.sqrt(lmid), np.maximum(0.0, x - move), np.minimum(1.0, x + move))
        xphys = physical(xnew)
        if xphys.sum() > target:
            l1 = lmid
        else:
            l2 = lmid
    return xnew, xphys


# --------------------------------------------------------------------------- the optimisation loop
@dataclass
class Result:
    xphys: np.ndarray                 # final physical density, the grid's shape
    compliance: float                 # of the final xphys
    n_iter: int
    converged: bool
    history: list = field(default_factory=list)   # compliance per iteration
    seconds: float = 0.0


def optimize(problem: Problem, penal: float = PENAL, rmin: float = 1.5, ft: str = "density",
             maxloop: int = 200, tolx: float = 0.01, solver: str = "auto", move: float = 0.2) -> Result:
    """SIMP with OC; stops when no design variable changes by more than ``tolx`` or after ``maxloop`` iterations."""
    if ft not in FILTERS:
        raise ValueError(f"unknown filter {ft!r}; choose one of {', '.join(FILTERS)}")
    if maxloop < 1:
        raise ValueError(f"maxloop must be >= 1, got {maxloop}")
    t0 = time.perf_counter()
    fe = FEModel(problem.shape, problem.fixed, solver=solver)
    H = DensityFilter(problem.shape, rmin)
    x = np.full(problem.shape, float(problem.volfrac))
    xphys = x.copy()
    physical = H if ft == "density" else (lambda z: z)
    history, change, loop = [], 1.0, 0
    while change > tolx and loop < maxloop:
        loop += 1
        u = fe.solve(xphys, problem.force, penal)
        ce = fe.element_energy(u)
        history.append(float(((EMIN + xphys**penal * (E0 - EMIN)) * ce).sum()))
        dc = -penal * (E0 - EMIN) * xphys ** (penal - 1) * ce
        dv = np.ones_like(x)
        if ft == "sensitivity":
            dc = H._correlate(x * dc) / H.Hs / np.maximum(1e-3, x)
        else:
            dc, dv = H.chain(dc), H.chain(dv)
        xnew, xphys = oc_update(x, dc, dv, problem.volfrac, physical, move)
        change = float(np.abs(xnew - x).max())
        x = xnew
    c = compliance(problem, xphys, penal, fe)
    return Result(xphys, c, loop, change <= tolx, history, time.perf_counter() - t0)
