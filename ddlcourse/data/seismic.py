"""Synthetic 3-D seismic volumes with an exact facies label at every voxel (the FaultSeg3D recipe).

Wu et al. (2019, "FaultSeg3D") train on synthetic volumes made in a few steps; this module follows them,
with facies labels instead of fault labels:

1. **Layers.** A 1-D column in *relative geologic time* ``tau`` (depth before any deformation): layers of
   random thickness, each with its own acoustic impedance, grouped into ``N_FACIES`` facies stacked as in
   the F3 Netherlands block (Alaudah et al. 2019): thick North Sea groups on top, thin and rare Chalk and
   Scruff layers, Zechstein salt at the base.
2. **Folding.** Smooth vertical shifts (a sum of 2-D Gaussian bumps, growing with depth) and a planar shear.
3. **Faults.** One to three planar faults; points on the hanging wall are moved along the fault's dip, so
   amplitudes *and* labels are displaced together.
4. **Seismic.** Reflectivity ``(I[z+1]-I[z]) / (I[z+1]+I[z])`` convolved along depth with a Ricker
   wavelet (written here: SciPy 1.17 removed ``scipy.signal.ricker``), plus band-limited noise.
   Some facies (Scruff, Zechstein) get a chaotic texture: random reflectivity that is not layered.

The label of a voxel is the facies of the layer whose ``tau`` lands there after folding and faulting: it is
exact, never interpolated. Volumes are ``(depth, x, y)``; the 2-D model of the lab works on *inline*
sections ``volume[:, i, :]`` (fixed ``x``).

Data sets go through :func:`ddlcourse.data.cache.load_or_make`: one chunk is one generated volume, from
which ``cubes_per_volume`` training cubes are cut (they may overlap, and they may be longer in depth
than wide, which Botelho et al. 2021 found to help).
"""
from __future__ import annotations

import numpy as np
from scipy.ndimage import convolve1d, gaussian_filter

from ddlcourse.data.cache import DataError, load_or_make

VERSION = "seismic-1"

FACIES = ("upper North Sea", "middle North Sea", "lower North Sea", "Chalk/Rijnland", "Scruff", "Zechstein")
N_FACIES = len(FACIES)
# share of the column's thickness per facies, top to bottom: F3-like, with two thin rare classes
FACIES_SHARE = np.array([0.26, 0.13, 0.36, 0.08, 0.05, 0.12])
FACIES_IMPEDANCE = np.array([2.0, 2.4, 2.9, 4.2, 3.3, 4.8])   # mean impedance per facies (arbitrary units)
# each facies has its own seismic character: bed thickness (samples) and impedance scatter between beds
FACIES_BEDS = ((6, 10), (2, 4), (3, 6), (2, 3), (3, 6), (5, 9))    # (min, max) bed thickness
FACIES_CONTRAST = np.array([0.04, 0.18, 0.09, 0.14, 0.06, 0.05])  # relative impedance scatter between beds
CHAOTIC = (4, 5)                                             # Scruff and Zechstein: chaotic reflections


# --------------------------------------------------------------------------- the wavelet
def ricker(n_samples: int, peak_freq: float, dt: float = 1.0) -> np.ndarray:
    """Ricker ("Mexican hat") wavelet of ``n_samples`` (odd), peak frequency in cycles per sample ``dt``.

    ``w(t) = (1 - 2 (pi f t)^2) exp(-(pi f t)^2)``, centred, maximum 1 at t = 0.
    """
    if n_samples < 3 or n_samples % 2 == 0:
        raise ValueError(f"n_samples must be odd and >= 3, got {n_samples}")
    if not 0 < peak_freq < 0.5 / dt:
        raise ValueError(f"peak_freq must lie in (0, Nyquist={0.5 / dt}), got {peak_freq}")
    t = (np.arange(n_samples) - n_samples // 2) * dt
    a = (np.pi * peak_freq * t) ** 2
    return (1 - 2 * a) * np.exp(-a)


# --------------------------------------------------------------------------- step 1: the layered column
def layered_column(n_tau: int, top: int, thickness: int, rng: np.random.Generator):
    """Impedance and facies label along relative geologic time ``tau = 0 .. n_tau-1`` (top to bottom).

    The facies occupy ``[top, top + thickness)`` in the shares ``FACIES_SHARE`` (jittered); the first
    facies continues above, the last below. Inside a facies, beds of random thickness
    (``FACIES_BEDS``) get impedances scattered around the facies mean (``FACIES_CONTRAST``): thin,
    contrasting beds ring at high frequency, thick quiet ones look transparent.
    """
    share = FACIES_SHARE * rng.uniform(0.8, 1.2, N_FACIES)
    edges = top + np.round(np.cumsum(share / share.sum()) * thickness).astype(int)   # bottom of each facies
    facies = np.searchsorted(edges[:-1], np.arange(n_tau), side="right")            # 0 .. N_FACIES-1
    imp = np.empty(n_tau)
    start = 0
    while start < n_tau:
        f = facies[start]
        other = np.flatnonzero(facies[start:] != f)
        end_of_facies = start + other[0] if other.size else n_tau
        lo, hi = FACIES_BEDS[f]
        stop = min(start + int(rng.integers(lo, hi + 1)), end_of_facies)
        imp[start:stop] = FACIES_IMPEDANCE[f] * (1 + FACIES_CONTRAST[f] * rng.standard_normal())
        start = stop
    return imp, facies.astype(np.uint8)


# --------------------------------------------------------------------------- step 2 and 3: deformation
def _fold_shift(z, x, y, shape, rng):
    """Vertical shift of folding (Gaussian bumps growing with depth) + planar shear, at points (z, x, y)."""
    d, nx, ny = shape
    s = np.zeros_like(z, dtype=float)
    for _ in range(int(rng.integers(2, 6))):
        cx, cy = rng.uniform(0, nx), rng.uniform(0, ny)
        sig = rng.uniform(0.15, 0.4) * max(nx, ny)
        amp = rng.uniform(-0.12, 0.12) * d
        s += amp * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * sig ** 2))
    s *= 0.5 + z / d                                    # folds grow with depth (FaultSeg3D: 1.5 z / d)
    e0, f, g = rng.uniform(-0.05, 0.05) * d, rng.uniform(-0.15, 0.15), rng.uniform(-0.15, 0.15)
    return s + e0 + f * x + g * y                       # + planar shear


def _fault_planes(shape, rng, n_faults):
    """Random planar faults: (point, unit normal, unit dip vector, slip)."""
    d, nx, ny = shape
    faults = []
    for _ in range(n_faults):
        strike = rng.uniform(0, np.pi)
        dip = np.deg2rad(rng.uniform(55, 80))           # steep normal faults
        horiz = np.array([0.0, np.cos(strike), np.sin(strike)])      # across-strike horizontal (x, y)
        normal = np.array([np.cos(dip), 0, 0]) + np.sin(dip) * horiz   # (z, x, y)
        normal /= np.linalg.norm(normal)
        dipvec = np.array([np.sin(dip), 0, 0]) - np.cos(dip) * horiz  # in the plane, pointing down
        dipvec /= np.linalg.norm(dipvec)
        point = np.array([rng.uniform(0.3, 0.7) * d, rng.uniform(0.25, 0.75) * nx, rng.uniform(0.25, 0.75) * ny])
        slip = rng.uniform(0.06, 0.15) * d * rng.choice([-1, 1])
        faults.append((point, normal, dipvec, slip))
    return faults


def deformed_tau(shape, rng, n_faults: int):
    """Relative geologic time at every voxel after folding and faulting; also the fault mask."""
    d, nx, ny = shape
    z, x, y = np.meshgrid(np.arange(d, dtype=float), np.arange(nx, dtype=float), np.arange(ny, dtype=float),
                          indexing="ij")
    pts = np.stack([z, x, y])                           # (3, d, nx, ny): where each voxel came from
    fault_mask = np.zeros(shape, bool)
    for point, normal, dipvec, slip in _fault_planes(shape, rng, n_faults):
        side = np.tensordot(normal, pts - point[:, None, None, None], axes=1)
        hanging = side > 0
        pts = np.where(hanging[None], pts - slip * dipvec[:, None, None, None], pts)   # move the hanging wall
        fault_mask |= np.abs(side) < 0.7
    shift = _fold_shift(pts[0], pts[1], pts[2], shape, rng)
    return pts[0] - shift, fault_mask


# --------------------------------------------------------------------------- step 4: the seismic image
def make_volume(shape=(64, 64, 64), seed: int | np.random.Generator = 0, n_faults=None, peak_freq: float = 0.12,
                noise: float = 0.25, chaos: float = 0.6) -> dict:
    """One synthetic volume: ``seismic`` (float32, unit std) and ``labels`` (uint8 facies), shape (depth, x, y).

    ``peak_freq``: Ricker peak frequency in cycles per depth sample; ``noise``: noise std relative to the
    signal's; ``chaos``: strength of the chaotic texture of the chaotic facies; ``n_faults``: 1-3 at random
    if ``None``. ``faults`` marks the voxels next to a fault plane.
    """
    if len(shape) != 3 or min(shape) < 4:
        raise DataError(f"shape must be (depth, x, y) with every size >= 4, got {shape}")
    rng = np.random.default_rng(seed) if not isinstance(seed, np.random.Generator) else seed
    n_faults = int(rng.integers(1, 4)) if n_faults is None else n_faults
    d = shape[0]
    margin = d                                           # tau reaches outside [0, d) after deformation
    imp_col, fac_col = layered_column(d + 2 * margin, margin, d, rng)
    tau, fault_mask = deformed_tau(shape, rng, n_faults)
    idx = np.clip(np.floor(tau).astype(int) + margin, 0, d + 2 * margin - 1)
    labels = fac_col[idx]                                # exact: the layer that lands on the voxel
    # reflectivity of the undeformed column, then moved with the layers (as in FaultSeg3D): no spurious
    # reflections along the fault planes
    refl_col = np.zeros_like(imp_col)
    refl_col[:-1] = (imp_col[1:] - imp_col[:-1]) / (imp_col[1:] + imp_col[:-1])
    refl = refl_col[idx]
    # chaotic facies: reflectivity that is not layered (a random field with short correlation lengths)
    field = gaussian_filter(rng.standard_normal(shape), sigma=(0.7, 1.5, 1.5))
    field *= np.abs(refl_col).max() / (field.std() + 1e-12)
    refl = refl + chaos * 0.5 * field * np.isin(labels, CHAOTIC)
    w = ricker(31, peak_freq)
    seis = convolve1d(refl, w, axis=0, mode="constant")
    seis /= seis.std() + 1e-12
    # band-limited noise: white noise through the same wavelet band, smoothed a little laterally
    nz = convolve1d(gaussian_filter(rng.standard_normal(shape), sigma=(0, 0.7, 0.7)), w, axis=0, mode="constant")
    seis = seis + noise * nz / (nz.std() + 1e-12)
    seis = (seis - seis.mean()) / (seis.std() + 1e-12)
    return {"seismic": seis.astype(np.float32), "labels": labels.astype(np.uint8), "faults": fault_mask,
            "n_faults": n_faults}


# --------------------------------------------------------------------------- cubes
def extract_cubes(volume: np.ndarray, cube, stride) -> tuple[np.ndarray, list]:
    """All cubes of size ``cube=(cd, cx, cy)`` at steps ``stride`` (overlapping when stride < cube).

    The last cube along each axis is aligned with the volume's end, so every voxel is covered.
    Returns ``(cubes, corners)``: cubes of shape (n, cd, cx, cy) and their corner indices.
    """
    cube, stride = tuple(cube), tuple(stride)
    if any(c > s for c, s in zip(cube, volume.shape)):
        raise DataError(f"cube {cube} is larger than the volume {volume.shape}")
    if any(s < 1 for s in stride):
        raise DataError(f"stride must be >= 1, got {stride}")
    starts = []
    for n, c, s in zip(volume.shape, cube, stride):
        st = list(range(0, n - c + 1, s))
        if st[-1] != n - c:
            st.append(n - c)
        starts.append(st)
    corners = [(a, b, c) for a in starts[0] for b in starts[1] for c in starts[2]]
    cubes = np.stack([volume[a:a + cube[0], b:b + cube[1], c:c + cube[2]] for a, b, c in corners])
    return cubes, corners


def random_cubes(vol: dict, cube, n: int, rng: np.random.Generator) -> dict:
    """``n`` cubes at random corners (they may overlap) from one volume: seismic and labels."""
    shape = vol["labels"].shape
    if any(c > s for c, s in zip(cube, shape)):
        raise DataError(f"cube {tuple(cube)} is larger than the volume {shape}")
    out = {"seismic": [], "labels": []}
    for _ in range(n):
        a, b, c = (int(rng.integers(0, s - k + 1)) for s, k in zip(shape, cube))
        sl = (slice(a, a + cube[0]), slice(b, b + cube[1]), slice(c, c + cube[2]))
        out["seismic"].append(vol["seismic"][sl])
        out["labels"].append(vol["labels"][sl])
    return {k: np.stack(v) for k, v in out.items()}


# --------------------------------------------------------------------------- data sets (cached, sharded)
def _settings(n_volumes, volume, cube, cubes_per_volume, seed):
    return dict(n_items=int(n_volumes) * int(cubes_per_volume), chunk_size=int(cubes_per_volume), seed=int(seed),
                volume=[int(v) for v in volume], cube=[int(c) for c in cube])


def training_cubes(n_volumes: int, volume, cube, cubes_per_volume: int = 2, seed: int = 0,
                   rank: int = 0, world_size: int = 1, use_cache: bool = True) -> dict:
    """This rank's training cubes: ``seismic`` (n, cd, cx, cy) float32, ``labels`` uint8, ``chunk`` ids.

    One chunk = one volume = ``cubes_per_volume`` cubes; rank ``r`` of ``world_size`` owns volumes
    ``r, r + world_size, ...``.
    """
    settings = _settings(n_volumes, volume, cube, cubes_per_volume, seed)

    def make_chunk(chunk_id, n_items, rng):
        vol = make_volume(tuple(volume), rng)
        cubes = random_cubes(vol, cube, n_items, rng)
        cubes["chunk"] = np.full(n_items, chunk_id, np.int64)
        return cubes

    return load_or_make("seismic-train", VERSION, settings, make_chunk, rank=rank, world_size=world_size,
                        use_cache=use_cache)


def test_volumes(n_volumes: int, volume, seed: int = 10_000, rank: int = 0, world_size: int = 1,
                 use_cache: bool = True) -> dict:
    """Whole held-out volumes (one per chunk), sharded by rank: ``seismic``, ``labels`` of shape (n, d, x, y)."""
    settings = dict(n_items=int(n_volumes), chunk_size=1, seed=int(seed), volume=[int(v) for v in volume])

    def make_chunk(chunk_id, n_items, rng):
        vol = make_volume(tuple(volume), rng)
        return {"seismic": vol["seismic"][None], "labels": vol["labels"][None]}

    return load_or_make("seismic-test", VERSION, settings, make_chunk, rank=rank, world_size=world_size,
                        use_cache=use_cache)


def class_frequencies(labels: np.ndarray) -> np.ndarray:
    """Share of voxels per facies."""
    return np.bincount(np.asarray(labels).ravel(), minlength=N_FACIES) / np.asarray(labels).size


def label_changes_between_sections(labels: np.ndarray, axis: int = 1) -> float:
    """Fraction of voxels whose label differs from the next section along ``axis`` (x = inlines).

    A 2-D model that predicts each inline on its own changes labels between neighbouring inlines far more
    often than the geology does: this number, against the ground truth's, measures the stitching.
    """
    a = np.asarray(labels)
    n = a.shape[axis]
    return float((a.take(range(1, n), axis) != a.take(range(n - 1), axis)).mean())
