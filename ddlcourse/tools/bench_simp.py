"""Speed and agreement of ``ddlcourse.physics.simp`` against the reference ``pytopo3d`` on one 3D problem.

    python -m ddlcourse bench-simp [--n 12] [--volfrac 0.3] [--maxloop 200]

Both solve top3d's default cantilever on an n x n x n grid (p = 3, rmin = 1.5, density filter, OC,
stop at a change of 0.01). A cube is used on purpose: pytopo3d 0.3.0 builds its filter neighbour lists
with a KD-tree whose element order differs from its element numbering unless nelx = nely = nelz
(found while validating this module), so only on a cube do both codes solve the same problem.
pytopo3d uses PyPardiso (multi-threaded MKL) when installed; this module uses LAPACK's banded Cholesky
(single-threaded) on small grids and SciPy's SuperLU on large ones.
"""
from __future__ import annotations

import argparse
import logging
import time

import numpy as np

from ddlcourse.physics import simp


def run_reference(n: int, volfrac: float, rmin: float = 1.5, maxloop: int = 200):
    """pytopo3d's top3d on the cube; returns (xphys in our (nz, ny, nx) layout, seconds)."""
    try:
        from pytopo3d.core.optimizer import top3d
    except ImportError as e:
        raise RuntimeError("pytopo3d is not installed; run 'make setup' (it is in env/requirements.lock)") from e
    logging.disable(logging.INFO)          # pytopo3d logs every iteration
    try:
        t0 = time.perf_counter()
        x = top3d(n, n, n, volfrac, simp.PENAL, rmin, disp_thres=0.5, maxloop=maxloop)
        seconds = time.perf_counter() - t0
    finally:
        logging.disable(logging.NOTSET)
    return np.asarray(x).transpose(2, 0, 1), seconds      # (nely, nelx, nelz) -> (nz, ny, nx)


def compare(n: int = 12, volfrac: float = 0.3, rmin: float = 1.5, maxloop: int = 200) -> dict:
    problem = simp.cantilever_3d(n, n, n, volfrac)
    mine = simp.optimize(problem, rmin=rmin, maxloop=maxloop)
    x_ref, t_ref = run_reference(n, volfrac, rmin, maxloop)
    c_ref = simp.compliance(problem, x_ref)      # the same FE model scores both designs
    return dict(n=n, c_mine=mine.compliance, c_ref=c_ref, rel_diff=abs(mine.compliance - c_ref) / c_ref,
                iters_mine=mine.n_iter, t_mine=mine.seconds, t_ref=t_ref, speed_ratio=t_ref / mine.seconds,
                max_density_diff=float(np.abs(mine.xphys - x_ref).max()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddlcourse bench-simp", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--volfrac", type=float, default=0.3)
    ap.add_argument("--maxloop", type=int, default=200)
    a = ap.parse_args(argv)
    r = compare(a.n, a.volfrac, maxloop=a.maxloop)
    print(f"cantilever {a.n}x{a.n}x{a.n}, volfrac {a.volfrac}: ddlcourse c = {r['c_mine']:.4f} "
          f"({r['iters_mine']} iterations, {r['t_mine']:.1f} s); pytopo3d c = {r['c_ref']:.4f} ({r['t_ref']:.1f} s)")
    print(f"relative compliance difference {100 * r['rel_diff']:.3f} %, max density difference {r['max_density_diff']:.2e}")
    print(f"speed: pytopo3d time / ddlcourse time = {r['speed_ratio']:.2f}")
    return 0
