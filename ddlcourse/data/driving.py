"""Multi-camera driving clips with traffic-conflict labels that come from the physics.

A top-down kinematic simulation at 10 Hz of the ego vehicle and one to three others, in one of three
scenarios (the conflict types of naturalistic driving studies such as SHRP2):

* ``lead_brake``  -- a lead vehicle in the ego lane brakes hard;
* ``cut_in``      -- a vehicle from the adjacent lane merges in front of the ego vehicle;
* ``crossing``    -- a vehicle crosses the ego path at an intersection.

Background vehicles drive along the other lane. The ego driver reacts after a random reaction time by braking
evasively when the time-to-collision (TTC) becomes short, or does not react at all (distraction). A collision
is inelastic: both vehicles stop where they touched, so the frames after a crash show them locked together.

Labels, from the simulated trajectories only:

* **crash** (2): the ego box overlaps another vehicle's box at some step (oriented boxes, separating axes);
* **near-crash** (1): no overlap, but the minimum TTC falls below ``TTC_NEAR`` (1.5 s) *and* the ego vehicle
  braked evasively (deceleration >= 3 m/s^2);
* **baseline** (0): otherwise.

Classes are drawn in the proportion crash : near-crash : baseline = 1 : 4 : 18, roughly that of SHRP2
(its 2015 release had 1,541 crashes and 2,705 near-crashes among many more baseline epochs), by rejection
sampling against per-chunk quotas, so every chunk has the same class balance.

Each clip is rendered by three synchronized cameras (frames of ``size x size``, grey): a forward perspective
camera, a rear camera, and a top-down bird's-eye view. Brake lights glow when a vehicle decelerates.
"""
from __future__ import annotations

import numpy as np

from ddlcourse.data import cache

VERSION = "driving-v2"
HZ = 10
DT = 1.0 / HZ
CLASSES = ("baseline", "near-crash", "crash")
SCENARIOS = ("lead_brake", "cut_in", "crossing")
VIEWS = ("forward", "rear", "top")
PROPORTIONS = np.array([18, 4, 1]) / 23        # baseline, near-crash, crash
TTC_NEAR = 1.5                                 # s
EVASIVE_DECEL = 3.0                            # m/s^2
CAR_L, CAR_W = 4.5, 1.8                        # m
LANE_W = 3.6                                   # m


# --------------------------------------------------------------------------- geometry
def box_corners(x, y, heading, length=CAR_L, width=CAR_W) -> np.ndarray:
    """Corners (..., 4, 2) of oriented boxes centred at (x, y)."""
    x, y, h = np.broadcast_arrays(np.asarray(x, float), np.asarray(y, float), np.asarray(heading, float))
    c, s = np.cos(h), np.sin(h)
    dx = np.array([1, 1, -1, -1]) * length / 2
    dy = np.array([1, -1, -1, 1]) * width / 2
    cx = x[..., None] + c[..., None] * dx - s[..., None] * dy
    cy = y[..., None] + s[..., None] * dx + c[..., None] * dy
    return np.stack([cx, cy], -1)


def boxes_overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Separating-axis test for convex quads ``a``, ``b`` of shape (..., 4, 2); True where they overlap."""
    out = np.ones(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), bool)
    for poly in (a, b):
        for i in range(2):                              # two edge normals per rectangle
            edge = poly[..., i + 1, :] - poly[..., i, :]
            ax, ay = -edge[..., 1:2], edge[..., 0:1]                    # normal of that edge
            pa = a[..., 0] * ax + a[..., 1] * ay                       # projections (..., 4)
            pb = b[..., 0] * ax + b[..., 1] * ay
            out &= ~((pa.max(-1) < pb.min(-1)) | (pb.max(-1) < pa.min(-1)))
    return out


def time_to_collision(ego: np.ndarray, other: np.ndarray, horizon: float = 3.0, step: float = 0.1) -> np.ndarray:
    """TTC per time step: extrapolate both at constant velocity until their boxes touch (inf if never).

    ``ego``, ``other``: (T, 5) states [x, y, heading, speed, accel].
    """
    tau = np.arange(0.0, horizon + 1e-9, step)                          # (K,)

    def future(s):
        vx, vy = s[:, 3] * np.cos(s[:, 2]), s[:, 3] * np.sin(s[:, 2])
        x = s[:, None, 0] + vx[:, None] * tau                            # (T, K)
        y = s[:, None, 1] + vy[:, None] * tau
        return box_corners(x, y, np.broadcast_to(s[:, None, 2], x.shape))

    hit = boxes_overlap(future(ego), future(other))                     # (T, K)
    first = np.where(hit.any(1), hit.argmax(1), -1)
    return np.where(first >= 0, tau[np.maximum(first, 0)], np.inf)


# --------------------------------------------------------------------------- simulation
def _integrate(x, y, h, v, a, lat_rate=0.0):
    v = max(0.0, v + a * DT)
    return x + v * np.cos(h) * DT, y + v * np.sin(h) * DT + lat_rate * DT, h, v


def simulate(rng: np.random.Generator, scenario: str, steps: int = 40) -> dict:
    """One clip's trajectories: ``states`` (n_vehicles, steps, 5) [x, y, heading, speed, accel]; vehicle 0 is ego."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of {SCENARIOS}")
    v_ego = rng.uniform(10, 22)
    veh = [dict(x=0.0, y=0.0, h=0.0, v=v_ego, a=0.0, lat=0.0)]
    danger = rng.uniform(0, 1) ** 2                                     # how aggressive; most clips are benign
    if scenario == "lead_brake":
        gap = rng.uniform(8, 30) * (1.2 - 0.7 * danger)
        veh.append(dict(x=CAR_L + gap, y=0.0, h=0.0, v=v_ego + rng.uniform(-2, 2), a=0.0, lat=0.0,
                        brake_at=rng.uniform(0.5, 1.5), decel=rng.uniform(2, 4) + 5 * danger))
    elif scenario == "cut_in":
        ahead = rng.uniform(3, 18) * (1.1 - 0.6 * danger)
        veh.append(dict(x=ahead, y=LANE_W, h=0.0, v=v_ego - rng.uniform(0, 3) - 4 * danger, a=0.0, lat=0.0,
                        cut_at=rng.uniform(0.3, 1.2), lat_speed=rng.uniform(1.0, 2.5)))
    else:  # crossing: a vehicle from the right crosses the ego lane at x_c
        t_arrive = rng.uniform(1.2, 2.8)
        x_c = v_ego * t_arrive
        v_c = rng.uniform(6, 14)
        miss = (1 - danger) * rng.choice([-1, 1]) * rng.uniform(0.5, 2.0)   # seconds early/late
        y0 = -v_c * (t_arrive + miss)
        veh.append(dict(x=x_c, y=y0, h=np.pi / 2, v=v_c, a=0.0, lat=0.0))
    for _ in range(rng.integers(0, 3)):                                  # background traffic in the other lane
        veh.append(dict(x=rng.uniform(-30, 40), y=LANE_W * rng.choice([1, -1]) * (1 if scenario != "cut_in" else -1),
                        h=0.0, v=rng.uniform(8, 22), a=0.0, lat=0.0))
    attentive = rng.random() < 0.75
    reaction = rng.uniform(0.4, 1.2)
    evasive = rng.uniform(4, 8)
    warn_since = None
    states = np.zeros((len(veh), steps, 5))
    for t in range(steps):
        time = t * DT
        for i, s in enumerate(veh):
            states[i, t] = (s["x"], s["y"], s["h"], s["v"], s["a"])
        # the scripted conflicts
        other = veh[1]
        if scenario == "lead_brake" and time >= other["brake_at"]:
            other["a"] = -other["decel"]
        if scenario == "cut_in" and time >= other["cut_at"]:
            other["lat"] = -other["lat_speed"] if other["y"] > 0 else 0.0
            if other["y"] <= 0:
                other["y"], other["lat"] = 0.0, 0.0
        # the ego driver: evasive braking after the reaction time once the TTC is short
        if attentive and t > 0:
            ttc = time_to_collision(states[0, t:t + 1], states[1, t:t + 1])[0]
            if ttc < 2.5 and warn_since is None:
                warn_since = time
            if warn_since is not None and time - warn_since >= reaction:
                veh[0]["a"] = -evasive
        for s in veh:
            if s.get("crashed"):
                continue
            s["x"], s["y"], s["h"], s["v"] = _integrate(s["x"], s["y"], s["h"], s["v"], s["a"], s["lat"])
            if s["v"] == 0.0:
                s["a"] = 0.0
        ego_box = box_corners(veh[0]["x"], veh[0]["y"], veh[0]["h"])
        for s in veh[1:]:                                               # inelastic collision: both stop
            if boxes_overlap(ego_box, box_corners(s["x"], s["y"], s["h"])):
                for v in (veh[0], s):
                    v.update(v=0.0, a=0.0, lat=0.0, crashed=True)
    return {"states": states, "scenario": scenario}


def label(states: np.ndarray) -> tuple[int, float, float]:
    """``(class, min TTC, max ego deceleration)`` of a clip, from its trajectories only."""
    ego = states[0]
    ego_box = box_corners(ego[:, 0], ego[:, 1], ego[:, 2])
    crash = False
    min_ttc = np.inf
    for other in states[1:]:
        crash |= bool(boxes_overlap(ego_box, box_corners(other[:, 0], other[:, 1], other[:, 2])).any())
        min_ttc = min(min_ttc, float(time_to_collision(ego, other).min()))
    max_decel = float(max(0.0, -ego[:, 4].min()))
    if crash:
        return 2, 0.0, max_decel
    if min_ttc < TTC_NEAR and max_decel >= EVASIVE_DECEL:
        return 1, min_ttc, max_decel
    return 0, min_ttc, max_decel


# --------------------------------------------------------------------------- rendering
def _fill_rect(img, r0, r1, c0, c1, value):
    h, w = img.shape
    r0, r1 = max(0, int(np.floor(r0))), min(h, int(np.ceil(r1)))
    c0, c1 = max(0, int(np.floor(c0))), min(w, int(np.ceil(c1)))
    if r0 < r1 and c0 < c1:
        img[r0:r1, c0:c1] = value


def render_perspective(states: np.ndarray, t: int, size: int, backward: bool = False) -> np.ndarray:
    """A pinhole camera on the ego roof looking forward (or backward): road, lane dashes, vehicles."""
    img = np.zeros((size, size), np.float32)
    horizon = size * 0.4
    img[int(horizon):] = 0.25                                           # road surface
    f = size * 0.9
    cam_h = 1.3
    ego = states[0, t]
    sign = -1.0 if backward else 1.0
    # lane dashes at fixed world x: they stream past at the ego speed
    for xw in np.arange(np.floor(ego[0] / 6) * 6 - 60, ego[0] + 60, 6.0):
        d = sign * (xw - ego[0])
        if d < 2:
            continue
        for yl in (LANE_W / 2, -LANE_W / 2):
            col = size / 2 + f * (-sign * (yl - ego[1])) / d
            row = horizon + f * cam_h / d
            _fill_rect(img, row, row + max(1, 6 / d), col - max(0.5, 3 / d), col + max(0.5, 3 / d), 0.8)
    order = sorted(range(1, len(states)), key=lambda i: -sign * (states[i, t, 0] - ego[0]))
    for i in order:                                                     # far to near (painter's order)
        o = states[i, t]
        d = sign * (o[0] - ego[0])
        if d < 1.0:
            continue
        lat = -sign * (o[1] - ego[1])
        w = abs(np.cos(o[2])) * CAR_W + abs(np.sin(o[2])) * CAR_L
        col, half, top = size / 2 + f * lat / d, f * w / 2 / d, horizon + f * (cam_h - 1.5) / d
        bottom = horizon + f * cam_h / d
        _fill_rect(img, top, bottom, col - half, col + half, 0.55)
        if o[4] < -1.0 and not backward:                                # brake lights
            _fill_rect(img, bottom - (bottom - top) * 0.35, bottom - (bottom - top) * 0.15,
                       col - half, col - half * 0.6, 1.0)
            _fill_rect(img, bottom - (bottom - top) * 0.35, bottom - (bottom - top) * 0.15,
                       col + half * 0.6, col + half, 1.0)
    return img


def render_top(states: np.ndarray, t: int, size: int, span: float = 40.0) -> np.ndarray:
    """Bird's-eye view centred ahead of the ego vehicle, ``span`` metres wide; ego drawn brighter."""
    img = np.zeros((size, size), np.float32)
    ego = states[0, t]
    scale = size / span
    cx0, cy0 = ego[0] + span * 0.3, ego[1]                              # view centre (ahead of ego)
    rows = ((np.array([LANE_W * 1.5, -LANE_W * 1.5]) - cy0) * -scale + size / 2)
    _fill_rect(img, rows.min(), rows.max(), 0, size, 0.2)
    yy, xx = np.mgrid[0:size, 0:size]
    wx = (xx + 0.5 - size / 2) / scale + cx0                            # world coordinates of pixel centres
    wy = -(yy + 0.5 - size / 2) / scale + cy0
    for i in range(len(states)):
        o = states[i, t]
        c, s = np.cos(o[2]), np.sin(o[2])
        u = (wx - o[0]) * c + (wy - o[1]) * s
        v = -(wx - o[0]) * s + (wy - o[1]) * c
        inside = (np.abs(u) <= CAR_L / 2) & (np.abs(v) <= CAR_W / 2)
        img[inside] = 1.0 if i == 0 else (0.85 if o[4] < -1.0 else 0.6)
    return img


def render_clip(states: np.ndarray, frames: int, size: int) -> np.ndarray:
    """(3 views, frames, size, size) float32, frames evenly spaced over the simulated steps."""
    steps = states.shape[1]
    ts = np.linspace(0, steps - 1, frames).round().astype(int)
    out = np.empty((len(VIEWS), frames, size, size), np.float32)
    for k, t in enumerate(ts):
        out[0, k] = render_perspective(states, t, size)
        out[1, k] = render_perspective(states, t, size, backward=True)
        out[2, k] = render_top(states, t, size)
    return out


# --------------------------------------------------------------------------- the data set
def quotas(n: int) -> np.ndarray:
    """Clips per class in a chunk of ``n`` (largest-remainder rounding of 18 : 4 : 1)."""
    raw = PROPORTIONS * n
    q = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - q))[: n - q.sum()]:
        q[i] += 1
    return q


def make_chunk(chunk_id: int, n: int, rng: np.random.Generator, frames: int, size: int, steps: int = 40,
               noise: float = 0.05, max_tries: int = 200) -> dict:
    """``n`` clips with the class quota of a chunk: ``video`` (n, 3, frames, size, size) float16, ``label`` (n,)."""
    need = quotas(n)
    videos, labels, scen, ttc = [], [], [], []
    tries = 0
    while need.sum() > 0:
        tries += 1
        if tries > max_tries * n:
            raise RuntimeError(f"chunk {chunk_id}: could not fill the class quotas {need} (generator bug)")
        sc = SCENARIOS[rng.integers(len(SCENARIOS))]
        sim = simulate(rng, sc, steps)
        cls, t_min, _ = label(sim["states"])
        if need[cls] == 0:
            continue
        need[cls] -= 1
        clip = render_clip(sim["states"], frames, size)
        clip += noise * rng.standard_normal(clip.shape).astype(np.float32)
        videos.append(clip.astype(np.float16))
        labels.append(cls)
        scen.append(SCENARIOS.index(sc))
        ttc.append(min(t_min, 99.0))
    order = rng.permutation(n)                                          # classes interleaved within a chunk
    return {"video": np.stack(videos)[order], "label": np.array(labels, np.int64)[order],
            "scenario": np.array(scen, np.int64)[order], "min_ttc": np.array(ttc, np.float32)[order]}


CHUNK = 23                                     # clips per generated chunk: one chunk holds the quotas 18 : 4 : 1


def _check_sizes(frames: int, size: int) -> None:
    if frames < 2 or size < 16:
        raise ValueError(f"need frames >= 2 and size >= 16, got frames={frames}, size={size}")


def _load(settings: dict, chunk_ids, frames: int, size: int, steps: int, use_cache: bool) -> list[dict]:
    """The chunks ``chunk_ids`` of the data set ``settings``, each made or read from the cache on its own.

    ``cache.load_or_make`` with ``world_size`` = the number of chunks hands "rank" ``c`` exactly chunk ``c``.
    """
    total = cache.n_chunks(settings["n_items"], settings["chunk_size"])
    return [cache.load_or_make("driving", VERSION, settings,
                               lambda cid, n, rng: make_chunk(cid, n, rng, frames, size, steps),
                               rank=c, world_size=total, use_cache=use_cache) for c in chunk_ids]


def generate(n_clips: int, frames: int, size: int, seed: int = 0, chunk_size: int = CHUNK, rank: int = 0,
             world_size: int = 1, use_cache: bool = True, steps: int = 40) -> dict:
    """This rank's share of the clips: the chunks ``rank, rank + world_size, ...`` (:mod:`ddlcourse.data.cache`)."""
    _check_sizes(frames, size)
    settings = dict(n_items=n_clips, chunk_size=chunk_size, seed=seed, frames=frames, size=size, steps=steps)
    return cache.load_or_make(
        "driving", VERSION, settings,
        lambda cid, n, rng: make_chunk(cid, n, rng, frames, size, steps),
        rank=rank, world_size=world_size, use_cache=use_cache)


def chunks_of(start: int, stop: int, chunk_size: int = CHUNK) -> range:
    """Ids of the chunks that hold clips ``start .. stop - 1``."""
    return range(start // chunk_size, -(-stop // chunk_size)) if stop > start else range(0)


def load_clips(n_clips: int, start: int, stop: int, frames: int, size: int, seed: int = 0,
               chunk_size: int = CHUNK, use_cache: bool = True, steps: int = 40) -> dict:
    """Clips ``start .. stop - 1`` of the data set of ``n_clips``: only the chunks that hold them are made or
    read, so a rank holds its own block and nothing more. The clips are those of :func:`generate`."""
    _check_sizes(frames, size)
    if not 0 <= start <= stop <= n_clips:
        raise ValueError(f"clips {start}..{stop} lie outside the data set of {n_clips} clips")
    settings = dict(n_items=n_clips, chunk_size=chunk_size, seed=seed, frames=frames, size=size, steps=steps)
    ids = chunks_of(start, stop, chunk_size)
    if not ids:                                  # an empty block (more replicas than clips): right shapes
        return {"video": np.zeros((0, len(VIEWS), frames, size, size), np.float16),
                "label": np.zeros(0, np.int64), "scenario": np.zeros(0, np.int64), "min_ttc": np.zeros(0, np.float32)}
    parts = _load(settings, ids, frames, size, steps, use_cache)
    first = ids[0] * chunk_size
    return {k: np.concatenate([p[k] for p in parts])[start - first:stop - first] for k in parts[0]}


def make_chunks(n_clips: int, chunk_ids, frames: int, size: int, seed: int = 0, chunk_size: int = CHUNK,
                steps: int = 40) -> None:
    """Make (and cache) the chunks ``chunk_ids``, keeping nothing in memory: the first pass of a sharded load."""
    _check_sizes(frames, size)
    settings = dict(n_items=n_clips, chunk_size=chunk_size, seed=seed, frames=frames, size=size, steps=steps)
    for c in chunk_ids:
        _load(settings, [c], frames, size, steps, use_cache=True)
