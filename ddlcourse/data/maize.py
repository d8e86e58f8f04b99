"""In-field maize images, made procedurally: crop rows on textured soil, seen from above.

Each plant is a short stalk with leaves that alternate sides (maize leaves are *distichous*: two
opposite ranks), each leaf a tapered, curved ribbon of random length, curvature and shade. Plants are
painted one after another in depth order (the painter's algorithm), so the instance-id mask of the
*visible* part of every plant is exact: a pixel belongs to the last plant painted over it.

Labelled anomalies are injected per row slot, as a field scout would record them:

====  ==========  =============================================================
code  name        what the generator does
====  ==========  =============================================================
0     normal      a healthy plant in its row slot
1     lodged      the stalk lies on the ground: long, tilted, leaves swept along it
2     yellowed    most leaves yellow, with brown disease spots
3     missing     the slot is empty (bare soil where a plant should be)
4     doubled     two plants in one slot, a few pixels apart
5     weed        a rosette of narrow, bluish leaves between the rows
====  ==========  =============================================================

Outputs per image: ``image`` (H, W, 3) uint8, ``instances`` (H, W) int16 (0 = soil, 1.. = plants) and
``plants`` (max_records, 6) float32 records ``[x, y, instance_id, n_leaves, anomaly, valid]``, where
(x, y) is the planting position (the centre of the anomaly crop) and ``instance_id`` 0 means no plant.

The *field size* is the number of image tiles (``n_items``): a weak-scaling run grows it with the number
of ranks. Everything is numpy; :func:`load` goes through :mod:`ddlcourse.data.cache` (seeded chunks,
sharded by rank, cached on disk).
"""
from __future__ import annotations

import numpy as np

from ddlcourse.data.cache import DataError, load_or_make

VERSION = "maize-1"
ANOMALIES = ("normal", "lodged", "yellowed", "missing", "doubled", "weed")
REC_FIELDS = ("x", "y", "instance_id", "n_leaves", "anomaly", "valid")
MAX_WEEDS = 2

GREEN = np.array([0.22, 0.50, 0.13])
YELLOW = np.array([0.72, 0.66, 0.22])
BROWN = np.array([0.38, 0.24, 0.12])
WEED = np.array([0.20, 0.42, 0.30])


# --------------------------------------------------------------------------- rasterising one ribbon
def ribbon(start, angle, length, curvature, width, n_samples: int = 24):
    """Centre line and half-widths of a tapered curved ribbon (a leaf or a stalk).

    The heading turns at a constant rate ``curvature`` (radians per pixel), so the centre line is a
    circular arc; the half-width rises quickly from the base and tapers to a point at the tip.
    Returns ``pts`` (n, 2) as (y, x), ``half`` (n,) and ``t`` (n,) in [0, 1] along the ribbon.
    """
    t = np.linspace(0.0, 1.0, n_samples)
    s = t * length
    heading = angle + curvature * s
    ds = length / (n_samples - 1)
    dy = np.concatenate([[0.0], np.cumsum(np.sin(heading[:-1]) * ds)])
    dx = np.concatenate([[0.0], np.cumsum(np.cos(heading[:-1]) * ds)])
    pts = np.stack([start[0] + dy, start[1] + dx], 1)
    half = 0.5 * width * np.minimum(1.0, 0.35 + 4 * t) * (1 - t) ** 0.7 + 0.35
    return pts, half, t


def rasterise(pts, half, t, shape):
    """Pixels covered by the discs of radius ``half`` along ``pts``.

    Returns ``(ys, xs, t_near, r_near)``: the covered pixels, the position along the ribbon of the
    nearest sample (for shading) and the relative distance to the centre line (0 = midrib, 1 = edge).
    """
    H, W = shape
    pad = half.max() + 1
    y0, y1 = max(int(pts[:, 0].min() - pad), 0), min(int(pts[:, 0].max() + pad) + 1, H)
    x0, x1 = max(int(pts[:, 1].min() - pad), 0), min(int(pts[:, 1].max() + pad) + 1, W)
    if y0 >= y1 or x0 >= x1:
        return (np.empty(0, int),) * 2 + (np.empty(0),) * 2
    yy, xx = np.mgrid[y0:y1, x0:x1]
    pix = np.stack([yy.ravel(), xx.ravel()], 1).astype(float)            # (P, 2)
    d2 = ((pix[:, None, :] - pts[None, :, :]) ** 2).sum(-1)             # (P, K)
    rel = d2 / half[None, :] ** 2                                       # < 1 inside that disc
    k = rel.argmin(1)
    r = rel[np.arange(len(pix)), k]
    hit = r <= 1.0
    return yy.ravel()[hit], xx.ravel()[hit], t[k[hit]], np.sqrt(r[hit])


# --------------------------------------------------------------------------- soil and plants
def soil(shape, rng, row_xs, row_width):
    """Brown soil: noise at three scales, a few clods, darker furrows along the rows. (H, W, 3) float."""
    H, W = shape
    tex = np.zeros((H, W))
    for cell, amp in ((16, 0.5), (4, 0.3), (1, 0.2)):
        g = rng.standard_normal((H // cell + 2, W // cell + 2))
        tex += amp * np.repeat(np.repeat(g, cell, 0), cell, 1)[:H, :W]
    xx = np.arange(W)[None, :]
    furrow = sum(np.exp(-0.5 * ((xx - x) / row_width) ** 2) for x in row_xs)
    base = np.array([0.42, 0.32, 0.22]) * rng.uniform(0.85, 1.15)
    img = base[None, None, :] * (1 + 0.10 * tex[..., None] - 0.12 * furrow[..., None])
    for _ in range(rng.integers(3, 8)):                                 # clods and stones
        cy, cx, rad = rng.uniform(0, H), rng.uniform(0, W), rng.uniform(0.6, 1.6)
        yy, xx2 = np.ogrid[:H, :W]
        img[(yy - cy) ** 2 + (xx2 - cx) ** 2 <= rad ** 2] *= rng.uniform(0.7, 1.25)
    return img


def plant_parts(center, rng, scale, kind: str):
    """The ribbons of one plant: list of (pts, half, t, colour, is_stalk, spots). ``kind`` in normal|lodged|yellowed|weed."""
    parts = []
    if kind == "weed":                                                  # a low rosette of narrow leaves
        n = int(rng.integers(6, 10))
        for i in range(n):
            a = 2 * np.pi * i / n + rng.uniform(-0.2, 0.2)
            pts, half, t = ribbon(center, a, rng.uniform(3, 6) * scale, rng.uniform(-0.15, 0.15), 1.6 * scale)
            parts.append((pts, half, t, WEED * rng.uniform(0.85, 1.15), False, 0))
        return parts, n
    plane = rng.uniform(-1.1, 1.1)                                      # leaf plane, roughly across the row
    if kind == "lodged":                                                # the stalk lies on the ground
        lean = rng.uniform(0, 2 * np.pi)
        stalk_len = rng.uniform(9, 13) * scale
        plane = lean
    else:
        lean = rng.uniform(0, 2 * np.pi)
        stalk_len = rng.uniform(1.0, 2.5) * scale
    stalk = ribbon(center, lean, stalk_len, rng.uniform(-0.05, 0.05), 2.2 * scale)
    n_leaves = int(rng.integers(4, 8))
    shade = rng.uniform(0.8, 1.2)
    for i in range(n_leaves):
        f = (i + 0.5) / n_leaves                                        # leaves climb the stalk
        k = min(int(f * (len(stalk[0]) - 1)), len(stalk[0]) - 1)
        side = np.pi * (i % 2)                                          # alternate sides
        spread = 0.6 if kind == "lodged" else 0.35
        a = plane + side + rng.uniform(-spread, spread)
        if kind == "lodged":                                            # swept along the fallen stalk
            a = lean + (1 if i % 2 else -1) * rng.uniform(0.3, 0.9)
        length = rng.uniform(6, 12) * scale * (1.0 - 0.35 * f)          # upper leaves are shorter
        curv = rng.choice([-1, 1]) * rng.uniform(0.02, 0.12) / scale
        col = GREEN * shade * rng.uniform(0.9, 1.1)
        spots = 0
        if kind == "yellowed" and rng.random() < 0.8:
            col = YELLOW * rng.uniform(0.85, 1.1)
            spots = int(rng.integers(1, 4))
        pts, half, t = ribbon(stalk[0][k], a, length, curv, rng.uniform(2.2, 3.2) * scale)
        parts.append((pts, half, t, col, False, spots))
    stalk_col = GREEN * 0.8 * shade if kind != "yellowed" else YELLOW * 0.8
    parts.append((*stalk, stalk_col, True, 0))                          # seen from above, the stalk is on top
    return parts, n_leaves


def paint_plant(img, inst, pid, parts, rng):
    """Paint one plant's ribbons over ``img`` (H, W, 3) and ``inst`` (H, W) in place."""
    for pts, half, t, col, is_stalk, spots in parts:
        ys, xs, tn, rn = rasterise(pts, half, t, inst.shape)
        if ys.size == 0:
            continue
        # lighter midrib, darker edges, a little darker towards the tip
        light = 1.0 + 0.25 * (1 - rn) - 0.15 * tn
        c = col[None, :] * light[:, None]
        if spots:
            for _ in range(spots):                                      # brown lesions
                j = rng.integers(0, ys.size)
                near = (ys - ys[j]) ** 2 + (xs - xs[j]) ** 2 <= rng.uniform(0.8, 2.0) ** 2
                c[near] = BROWN * rng.uniform(0.8, 1.1)
        img[ys, xs] = c
        inst[ys, xs] = pid


def make_image(rng, size: int = 64, n_rows: int = 2, n_slots: int = 5, anomaly_rate: float = 0.25,
               weed_rate: float = 0.4):
    """One field tile: ``(image uint8 (H, W, 3), instances int16 (H, W), plants (R, 6) float32)``."""
    H = W = size
    scale = size / (18.0 * n_rows)                                       # plant size follows row spacing
    row_xs = (np.arange(n_rows) + 0.5) * W / n_rows + rng.uniform(-2, 2, n_rows) * scale
    img = soil((H, W), rng, row_xs, 2.5 * scale)
    inst = np.zeros((H, W), np.int16)
    p = anomaly_rate / 4
    plants, records = [], []                                             # plants: (depth, center, kind, record index)
    for rx in row_xs:
        for j in range(n_slots):
            cy = (j + 0.5) * H / n_slots + rng.uniform(-1.5, 1.5) * scale
            cx = rx + rng.uniform(-1.0, 1.0) * scale
            anomaly = int(rng.choice(5, p=[1 - 4 * p, p, p, p, p]))
            rec = len(records)
            records.append([cx, cy, 0, 0, anomaly, 1])
            if anomaly == 3:                                             # missing plant
                continue
            kind = {0: "normal", 1: "lodged", 2: "yellowed", 4: "normal"}[anomaly]
            plants.append((rng.uniform(0.3, 1.0), (cy, cx), kind, rec))
            if anomaly == 4:                                             # a second plant in the same slot
                a = rng.uniform(0, 2 * np.pi)
                d = rng.uniform(2.5, 4.0) * scale
                plants.append((rng.uniform(0.3, 1.0), (cy + d * np.sin(a), cx + d * np.cos(a)), "normal", -1))
    for _ in range(min(rng.poisson(weed_rate), MAX_WEEDS)):               # weeds between the rows
        gap = rng.integers(0, n_rows + 1)
        edges = np.concatenate([[0.0], row_xs, [W]])
        cx = 0.5 * (edges[gap] + edges[gap + 1]) + rng.uniform(-2, 2) * scale
        cy = rng.uniform(0.1, 0.9) * H
        records.append([cx, cy, 0, 0, 5, 1])
        plants.append((rng.uniform(0.0, 0.25), (cy, cx), "weed", len(records) - 1))   # weeds are low: painted first
    order = sorted(range(len(plants)), key=lambda i: plants[i][0])
    for pid, i in enumerate(order, start=1):
        _, center, kind, rec = plants[i]
        parts, n_leaves = plant_parts(np.array(center), rng, scale, kind)
        paint_plant(img, inst, pid, parts, rng)
        if rec >= 0 and records[rec][2] == 0:
            records[rec][2], records[rec][3] = pid, n_leaves
    img = np.clip(img + rng.normal(0, 0.012, img.shape), 0, 1)          # sensor noise
    out = np.zeros((n_rows * n_slots + MAX_WEEDS, len(REC_FIELDS)), np.float32)
    out[:len(records)] = records
    return (img * 255).astype(np.uint8), inst, out


# --------------------------------------------------------------------------- the data set
def settings(n_items: int, chunk_size: int, seed: int, size: int = 64, n_rows: int = 2, n_slots: int = 5,
             anomaly_rate: float = 0.25, weed_rate: float = 0.4) -> dict:
    """The generator settings (they key the cache). ``n_items`` is the field size in image tiles."""
    if size % 8 or size < 32:
        raise DataError(f"image size must be a multiple of 8 and >= 32 (the U-Net halves it three times), got {size}")
    if not 0 <= anomaly_rate <= 1:
        raise DataError(f"anomaly_rate must lie in [0, 1], got {anomaly_rate}")
    return dict(n_items=int(n_items), chunk_size=int(chunk_size), seed=int(seed), size=int(size),
                n_rows=int(n_rows), n_slots=int(n_slots), anomaly_rate=float(anomaly_rate),
                weed_rate=float(weed_rate))


def _make_chunk(s: dict):
    def make(chunk_id, n, rng):
        imgs, insts, recs = zip(*(make_image(rng, s["size"], s["n_rows"], s["n_slots"], s["anomaly_rate"],
                                             s["weed_rate"]) for _ in range(n)))
        return {"image": np.stack(imgs), "instances": np.stack(insts), "plants": np.stack(recs),
                "chunk": np.full(n, chunk_id, np.int32)}
    return make


def load(s: dict, rank: int = 0, world_size: int = 1, use_cache: bool = True) -> dict:
    """This rank's chunks of the field: ``image`` (n, H, W, 3) uint8, ``instances`` (n, H, W) int16,
    ``plants`` (n, R, 6) float32, ``chunk`` (n,) the chunk id of each image."""
    return load_or_make("maize", VERSION, s, _make_chunk(s), rank=rank, world_size=world_size, use_cache=use_cache)


# --------------------------------------------------------------------------- derived arrays
def centroids(inst: np.ndarray) -> dict[int, tuple[float, float]]:
    """Centroid (y, x) of every visible instance of one (H, W) mask."""
    ids = inst.ravel().astype(np.int64)
    n = ids.max() + 1
    yy, xx = np.indices(inst.shape)
    cnt = np.bincount(ids, minlength=n)
    sy, sx = np.bincount(ids, yy.ravel(), n), np.bincount(ids, xx.ravel(), n)
    return {i: (sy[i] / cnt[i], sx[i] / cnt[i]) for i in range(1, n) if cnt[i] > 0}


def targets(inst: np.ndarray, sigma: float = 2.0) -> np.ndarray:
    """Training targets of one (H, W) instance mask, (4, H, W) float32:
    foreground, centre heatmap (a Gaussian at each instance centroid), offset to the centroid (dy, dx) in pixels."""
    H, W = inst.shape
    out = np.zeros((4, H, W), np.float32)
    out[0] = inst > 0
    yy, xx = np.indices((H, W), dtype=np.float32)
    for i, (cy, cx) in centroids(inst).items():
        out[1] = np.maximum(out[1], np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * sigma ** 2)))
        m = inst == i
        out[2][m], out[3][m] = cy - yy[m], cx - xx[m]
    return out


def crops(images: np.ndarray, plants: np.ndarray, size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Square crops around every valid plant record: ``(crops (n, size, size, 3) uint8, records (n, 6))``."""
    h = size // 2
    out, recs = [], []
    for img, rec in zip(images, plants):
        padded = np.pad(img, ((h, h), (h, h), (0, 0)), mode="reflect")
        for r in rec[rec[:, 5] > 0]:
            y, x = int(round(r[1])) + h, int(round(r[0])) + h
            out.append(padded[y - h:y + h, x - h:x + h])
            recs.append(r)
    if not out:
        return np.zeros((0, size, size, 3), np.uint8), np.zeros((0, len(REC_FIELDS)), np.float32)
    return np.stack(out), np.stack(recs)
