"""The SIMP solver: element matrices, finite elements against an independent dense assembly, the filter,
the MBB beam of the 88-line paper, and the 3D cross-check against pytopo3d."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from ddlcourse.physics import simp


# --------------------------------------------------------------------------- element stiffness
def test_q4_matches_closed_form_of_the_88_line_code():
    nu = 0.3
    k = np.array([1 / 2 - nu / 6, 1 / 8 + nu / 8, -1 / 4 - nu / 12, -1 / 8 + 3 * nu / 8,
                  -1 / 4 + nu / 12, -1 / 8 - nu / 8, nu / 6, 1 / 8 - 3 * nu / 8]) / (1 - nu**2)
    KE = simp.element_stiffness(2, nu)
    np.testing.assert_allclose(KE[0], k, atol=1e-14)
    np.testing.assert_allclose(KE, KE.T, atol=1e-14)


@pytest.mark.parametrize("dim, rigid_modes", [(2, 3), (3, 6)])
def test_element_has_exactly_the_rigid_body_modes(dim, rigid_modes):
    ev = np.linalg.eigvalsh(simp.element_stiffness(dim))
    assert (np.abs(ev) < 1e-10).sum() == rigid_modes
    assert ev.min() > -1e-12


# --------------------------------------------------------------------------- finite elements
def dense_compliance(problem, x, penal=3.0):
    """Independent reference: element loop, dense K, numpy solve (slow, tiny grids only)."""
    KE = simp.element_stiffness(problem.dim)
    nd = simp.n_dofs(problem.shape)
    K = np.zeros((nd, nd))
    for e, dofs in enumerate(simp.element_dofs(problem.shape)):
        K[np.ix_(dofs, dofs)] += (simp.EMIN + x.ravel()[e] ** penal * (1 - simp.EMIN)) * KE
    free = np.setdiff1d(np.arange(nd), problem.fixed)
    u = np.zeros(nd)
    u[free] = np.linalg.solve(K[np.ix_(free, free)], problem.force[free])
    return problem.force @ u


def test_element_dofs_are_geometric_neighbours():
    # element (iy=1, ix=2) of a 3x4 grid: corners (1,2), (1,3), (2,3), (2,2) in (iy, ix); node id = iy*5 + ix
    e = 1 * 4 + 2
    dofs = simp.element_dofs((3, 4))[e]
    nodes = np.array([1 * 5 + 2, 1 * 5 + 3, 2 * 5 + 3, 2 * 5 + 2])
    np.testing.assert_array_equal(dofs, np.stack([2 * nodes, 2 * nodes + 1], 1).ravel())


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4)])
@pytest.mark.parametrize("solver", ["auto", "banded", "direct", "cg"])
def test_sparse_fe_matches_dense_assembly(shape, solver):
    rng = np.random.default_rng(0)
    if len(shape) == 2:
        problem = simp.mbb_beam(shape[1], shape[0])
    else:
        problem = simp.cantilever_3d(shape[2], shape[1], shape[0])
    x = rng.uniform(0.05, 1.0, shape)
    fe = simp.FEModel(problem.shape, problem.fixed, solver=solver)
    c = simp.compliance(problem, x, fe=fe)
    assert c == pytest.approx(dense_compliance(problem, x), rel=1e-8)


def test_uniform_bar_in_tension_has_the_exact_compliance():
    # bilinear elements represent uniaxial stress exactly: c = F^2 L / (E A), A = height (unit thickness)
    ny, nx = 2, 4
    shape = (ny, nx)
    f = np.zeros(simp.n_dofs(shape))
    right = simp.node_dofs(shape, (slice(None), nx), axes=0)
    f[right] = 1.0 / ny
    f[right[[0, -1]]] = 0.5 / ny                     # consistent nodal loads of a unit traction
    fixed = np.concatenate([simp.node_dofs(shape, (slice(None), 0), axes=0), simp.node_dofs(shape, (0, 0), axes=1)])
    c = simp.compliance(simp.Problem(shape, f, fixed, 0.5), np.ones(shape))
    assert c == pytest.approx(1.0 * nx / ny, rel=1e-10)


# --------------------------------------------------------------------------- filter
def explicit_filter_matrix(shape, rmin):
    """The papers' H by a loop over element pairs (independent of the correlation in simp)."""
    centres = np.array(list(np.ndindex(*shape)), float)
    d = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    return np.maximum(0.0, rmin - d)


@pytest.mark.parametrize("shape, rmin", [((5, 7), 1.5), ((5, 7), 2.6), ((3, 4, 5), 1.5)])
def test_density_filter_equals_the_h_matrix(shape, rmin):
    H = explicit_filter_matrix(shape, rmin)
    x = np.random.default_rng(1).uniform(size=shape)
    filt = simp.DensityFilter(shape, rmin)
    np.testing.assert_allclose(filt(x).ravel(), H @ x.ravel() / H.sum(1), atol=1e-12)
    np.testing.assert_allclose(filt.chain(x).ravel(), H.T @ (x.ravel() / H.sum(1)), atol=1e-12)


# --------------------------------------------------------------------------- MBB beam (Andreassen et al. 2011)
@pytest.fixture(scope="module")
def mbb():
    return simp.optimize(simp.mbb_beam(60, 20, 0.5), penal=3.0, rmin=1.5, ft="sensitivity", maxloop=500)


def test_mbb_converges_to_the_published_design(mbb):
    # the 88-line code, top88(60, 20, 0.5, 3, 1.5, 1), stops after 94 iterations at c = 203.2
    assert mbb.converged and mbb.n_iter == 94
    assert mbb.compliance == pytest.approx(203.18, rel=2e-3)
    assert mbb.xphys.mean() == pytest.approx(0.5, abs=1e-3)


def test_mbb_design_is_a_truss(mbb):
    x = mbb.xphys
    holes, n_holes = ndimage.label(x < 0.5)
    assert n_holes >= 4                          # the classic design has 4-5 openings between its bars
    solid, n_solid = ndimage.label(x >= 0.5)
    assert n_solid == 1                          # one connected structure
    assert x[0, 0] > 0.9 and x[-1, -1] > 0.9     # material under the load and on the support
    assert np.mean((x > 0.1) & (x < 0.9)) < 0.3  # mostly black and white
    assert mbb.history[-1] < mbb.history[0] / 2


def test_density_filter_mbb():
    r = simp.optimize(simp.mbb_beam(60, 20, 0.5), rmin=1.5, ft="density", maxloop=500)
    assert r.converged and r.compliance == pytest.approx(218.8, rel=2e-3)


# --------------------------------------------------------------------------- 3D and the reference
def test_3d_cross_check_against_pytopo3d():
    pytest.importorskip("pytopo3d")
    from ddlcourse.tools import bench_simp
    r = bench_simp.compare(n=6, volfrac=0.3, maxloop=60)
    assert r["rel_diff"] < 0.01, r
    assert r["max_density_diff"] < 1e-3, r


def test_3d_optimisation_lowers_compliance_and_keeps_volume():
    r = simp.optimize(simp.cantilever_3d(8, 4, 2, 0.3), maxloop=30)
    assert r.xphys.mean() == pytest.approx(0.3, abs=2e-3)
    assert r.compliance < 0.5 * r.history[0]


# --------------------------------------------------------------------------- bad input
def test_bad_input_gets_clear_errors():
    p = simp.mbb_beam(6, 2)
    with pytest.raises(ValueError, match="filter"):
        simp.optimize(p, ft="heaviside")
    with pytest.raises(ValueError, match="solver"):
        simp.FEModel((2, 6), p.fixed, solver="magic")
    with pytest.raises(ValueError, match="shape"):
        simp.Problem((4,), np.zeros(10), [0], 0.5)
    with pytest.raises(ValueError, match="volfrac"):
        simp.Problem((2, 6), p.force, p.fixed, 1.5)
    with pytest.raises(ValueError, match="free DOFs"):
        simp.Problem((2, 6), np.where(np.isin(np.arange(len(p.force)), p.fixed), 1.0, 0.0), p.fixed, 0.5)
    with pytest.raises(ValueError, match="grid"):
        simp.FEModel((2, 6), p.fixed).solve(np.ones((3, 6)), p.force)
