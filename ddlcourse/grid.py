"""The one place where process groups are made: a grid of ranks with named axes, its torch groups and MPI comms.

Every parallelism splits the ranks along some axes. :func:`build` lays the ranks out as
``torch.arange(world).view(*sizes)`` (the first axis outermost, the last one neighbours), as picotron's process
group manager and torchtitan's ``parallel_dims.build_mesh`` do, and gives this rank's view of it::

    g = grid.build(dp=2, tp=2)          # 4 ranks:  dp 0: ranks 0 1   (a tp line)
                                        #           dp 1: ranks 2 3
    g.coord("dp"), g.ranks("tp")        # rank 2: 1, [2, 3]
    g.group("dp")                       # torch.distributed group of ranks [0, 2] on ranks 0 and 2
    g.comm("tp")                        # mpi4py communicator of ranks [2, 3] on ranks 2 and 3
    g.device_mesh("cpu")                # a torch DeviceMesh with dims ("dp", "tp") over the same groups

Axis names come from :data:`AXES` only. Sizes must multiply to the world size; the axis :data:`DEFAULT_AXIS`
(``dp``), when it is not named, takes whatever is left and goes outermost (``build(tp=2)`` on 8 ranks is
``dp=4, tp=2``). ``first=n`` lays the grid over the first ``n`` ranks only (one cluster running a 2-rank experiment
inside 4 ranks); the other ranks get a grid with ``inside`` False, whose ``group``/``comm`` are None.

Groups are made once and cached, per rank line:

* torch groups (:func:`group_of`): ``new_group`` is collective over the whole torch world, so every rank of the
  world, inside the grid or not, calls ``group(axis)`` for the same axes in the same order; it makes every line
  of that axis not made before. The cache follows the torch world (:func:`_follow_torch_world`): after
  ``destroy_process_group`` and a new ``init_process_group`` it starts empty.
* MPI communicators (:func:`comm_of`): ``MPI_Comm_create_group`` on ``COMM_WORLD``, collective over the ranks
  of the line only, so a rank line can be made lazily by its own ranks (the first forward of a SyncBatchNorm, the
  hosts of a hierarchical allreduce, uneven ones included). A ``Split`` would need every rank of its parent at
  once, and a line cached on some ranks but not on others (the same line met in two different splits) would
  leave them waiting in different calls; per-line creation by the line's own ranks cannot.

:func:`comm_for_group` is the MPI communicator of a torch group where MPI can carry it (:func:`mpi_usable`), the
one used by SyncBatchNorm and the DDP hook. :func:`release` frees the communicators and forgets the groups
(``dist.shutdown`` calls it). The grid uses
``COMM_WORLD`` ranks and torch ranks as one numbering, which ``dist.init`` makes true.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as tdist

AXES = {
    "dp": "data parallel: replicas of the model, each on its share of the batch; gradients are averaged along it",
    "tp": "tensor parallel: each layer of one replica split over the ranks (column- and row-parallel)",
    "pp": "pipeline parallel: consecutive stages of the layers, activations passed along it",
    "cp": "context parallel: the sequence of one sample split over the ranks (ring attention)",
    "ep": "expert parallel: the experts of a mixture-of-experts layer spread over the ranks",
    "mp": "model parallel of the labs: a lab's tensor or spatial split of one replica",
}
DEFAULT_AXIS = "dp"     # takes the ranks the named axes leave over, outermost (as torchtitan's dp_replicate)

_TORCH: dict = {"world": None, "groups": {}, "meshes": {}, "mpi": {}}   # follows one torch world: _follow_torch_world
_COMMS: dict = {}        # (tuple of COMM_WORLD ranks, tag) -> mpi4py communicator (valid until release)
_BEFORE_RELEASE: list = []   # what release() calls first (see before_release)


# --------------------------------------------------------------------------- the layout (no communication)
def _sizes(axes: dict, world: int | None) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Validated ``(names, sizes)``; with ``world``, the default axis filled in and the product checked."""
    unknown = [a for a in axes if a not in AXES]
    if unknown:
        raise ValueError(f"unknown axis name(s) {unknown}; the axes are {', '.join(AXES)} (ddlcourse.grid.AXES)")
    bad = {a: s for a, s in axes.items() if not isinstance(s, int) or isinstance(s, bool) or s < 1}
    if bad:
        raise ValueError(f"axis sizes must be integers >= 1, got {bad}")
    names, sizes = tuple(axes), tuple(axes.values())
    if world is None:
        return names, sizes
    prod = math.prod(sizes)
    if DEFAULT_AXIS not in axes and (prod != world or not axes) and world % prod == 0:
        return (DEFAULT_AXIS,) + names, (world // prod,) + sizes
    if prod != world:
        shown = " * ".join(f"{a}={s}" for a, s in axes.items()) or "no axes"
        raise ValueError(f"axis sizes {shown} multiply to {prod}, but the grid has {world} ranks"
                         + ("" if DEFAULT_AXIS in axes else f" (the rest would go to {DEFAULT_AXIS}, but "
                                                            f"{prod} does not divide {world})"))
    return names, sizes


def layout(**axes: int) -> list:
    """``torch.arange(n).view(*sizes).tolist()``: the grid of ranks, e.g. ``layout(dp=2, tp=2) == [[0, 1], [2, 3]]``."""
    names, sizes = _sizes(axes, None)
    return torch.arange(math.prod(sizes)).view(*sizes).tolist()


# --------------------------------------------------------------------------- the one cache of torch groups
def _follow_torch_world() -> None:
    """Forget every cached torch group and mesh when the torch world is not the one they were made in.

    A group belongs to the default process group it was made under: after ``destroy_process_group`` and a new
    ``init_process_group`` the old ones are dead, and a new ``new_group`` must be made on every rank again.
    """
    world = tdist.group.WORLD if tdist.is_available() and tdist.is_initialized() else None
    if _TORCH["world"] is not world:
        _TORCH.update(world=world, groups={}, meshes={}, mpi={})


def _need_torch() -> None:
    _follow_torch_world()
    if _TORCH["world"] is None:
        raise RuntimeError("torch.distributed is not initialised: call ddlcourse.dist.init() on every rank first")


def group_of(lines) -> object | None:
    """This rank's torch group among the disjoint rank ``lines`` (None where it is in none of them).

    Collective over the whole torch world: every rank calls it with the same lines, and every line not yet
    cached is made with ``new_group`` in the order given (a line made once is reused by every later caller).
    """
    _need_torch()
    cache, me, mine = _TORCH["groups"], tdist.get_rank(), None
    for line in lines:
        key = tuple(int(r) for r in line)
        if key not in cache:
            cache[key] = tdist.new_group(ranks=list(key))
        if me in key:
            mine = cache[key]
    return mine


def device_mesh_of(group, device_type: str):
    """A 1-D DeviceMesh over an existing torch ``group`` (None: the world), for FSDP2/DTensor on a subgroup."""
    from torch.distributed.device_mesh import DeviceMesh

    _need_torch()
    group = group if group is not None else tdist.group.WORLD
    key = (group, device_type)
    if key not in _TORCH["meshes"]:
        _TORCH["meshes"][key] = DeviceMesh.from_group(group, device_type)
    return _TORCH["meshes"][key]


# --------------------------------------------------------------------------- the one cache of MPI communicators
def comm_of(ranks, tag: str = ""):
    """The mpi4py communicator of these ``COMM_WORLD`` ranks, in this order (rank i of it is ``ranks[i]``).

    Collective over those ranks only, the first time; cached after that. None on a rank not in ``ranks``
    (which takes no part). Freed by :func:`release`, not by the caller. ``tag``: a user that must never share a
    communicator with any other (the DDP hook's non-blocking allreduces, ``tag="ddp-hook"``) gets one of its own.
    """
    key = ranks if type(ranks) is tuple else tuple(int(r) for r in ranks)
    if (key, tag) in _COMMS:    # SyncBatchNorm asks three times per layer and step: no MPI call on this path
        return _COMMS[key, tag]
    from mpi4py import MPI      # optional heavy import: a torch-only user of the grid never loads MPI

    world = MPI.COMM_WORLD
    if world.Get_rank() not in key:
        return None
    everyone = world.Get_group()
    members = everyone.Incl(list(key))
    _COMMS[key, tag] = world.Create_group(members)
    members.Free()
    everyone.Free()
    return _COMMS[key, tag]


def mpi_usable() -> str | None:
    """None when MPI can carry this process's collectives over torch groups; else the reason it cannot.

    MPI must be up with ``MPI_THREAD_MULTIPLE`` (Horovod's background thread, or a SyncBatchNorm layer, may be in
    an MPI call of its own at the same time), and the torch ranks must be the MPI ranks (``dist.init`` makes
    them so)."""
    try:
        from mpi4py import MPI  # optional heavy import, as above
    except ImportError:
        return "mpi4py is not installed"
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return "MPI is not initialised (or already finalised)"
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        return "MPI was initialised without MPI_THREAD_MULTIPLE"
    if not tdist.is_initialized():
        return "torch.distributed is not initialised"
    world = MPI.COMM_WORLD
    if tdist.get_world_size() != world.Get_size() or tdist.get_rank() != world.Get_rank():
        return "the torch ranks are not the MPI ranks"
    return None


def comm_for_group(group=None, tag: str = ""):
    """The MPI communicator with the ranks of the torch ``group`` (None: the world), or None where MPI cannot carry
    it (:func:`mpi_usable`). Decided once per group and tag, then a dictionary lookup (SyncBatchNorm asks three
    times per layer and step); the communicator is :func:`comm_of`'s. Collective over the group's ranks the first
    time."""
    _follow_torch_world()
    key = (group, tag)
    if key not in _TORCH["mpi"]:
        _TORCH["mpi"][key] = None if mpi_usable() is not None else \
            tuple(tdist.get_process_group_ranks(group if group is not None else tdist.group.WORLD))
    ranks = _TORCH["mpi"][key]
    return None if ranks is None else comm_of(ranks, tag)


def before_release(fn) -> None:
    """Call ``fn(tag)`` before :func:`release` frees communicators (of that tag, or every tag when None): the DDP
    hook waits for its requests in flight there, so no request outlives its communicator."""
    if fn not in _BEFORE_RELEASE:
        _BEFORE_RELEASE.append(fn)


def release(tag: str | None = None) -> int:
    """Free the cached MPI communicators (those of ``tag``; None: all of them, and forget every torch group and
    mesh too: ``dist.shutdown`` calls it). Collective over each communicator's ranks. Returns how many it freed."""
    for fn in _BEFORE_RELEASE:
        fn(tag)
    keys = [k for k in _COMMS if tag is None or k[1] == tag]
    for k in keys:
        _COMMS.pop(k).Free()
    if tag is None:
        _TORCH.update(world=None, groups={}, meshes={}, mpi={})
    else:
        _TORCH["mpi"] = {k: v for k, v in _TORCH["mpi"].items() if k[1] != tag}
    return len(keys)


# --------------------------------------------------------------------------- the grid
def _world_and_rank() -> tuple[int, int]:
    """The torch world when it is up, else MPI's (both are one numbering after ``dist.init``)."""
    if tdist.is_available() and tdist.is_initialized():
        return tdist.get_world_size(), tdist.get_rank()
    from mpi4py import MPI      # optional heavy import, as above
    return MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()


@dataclass(frozen=True)
class Grid:
    """This rank's place in a grid of the first ``n`` ranks with named axes (see the module docstring)."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    n: int                    # ranks in the grid: 0 .. n-1 of the world
    rank: int                 # this rank, in the world's numbering

    @property
    def inside(self) -> bool:
        return self.rank < self.n

    @property
    def layout(self) -> list:
        """The grid of ranks, ``torch.arange(n).view(*sizes).tolist()``."""
        return torch.arange(self.n).view(*self.sizes).tolist()

    def _axis(self, axis: str) -> int:
        if axis not in self.names:
            raise ValueError(f"axis {axis!r} is not in this grid {dict(zip(self.names, self.sizes))}")
        return self.names.index(axis)

    def size(self, axis: str) -> int:
        return self.sizes[self._axis(axis)]

    def coord(self, axis: str) -> int | None:
        """This rank's index along ``axis`` (None outside the grid)."""
        i = self._axis(axis)
        if not self.inside:
            return None
        return (self.rank // math.prod(self.sizes[i + 1:])) % self.sizes[i]

    def lines(self, axis: str) -> list[list[int]]:
        """Every rank line along ``axis``, in a fixed order: the groups of that axis."""
        i = self._axis(axis)
        grid = torch.arange(self.n).view(*self.sizes)
        return grid.movedim(i, -1).reshape(-1, self.sizes[i]).tolist()

    def ranks(self, axis: str) -> list[int] | None:
        """The line along ``axis`` through this rank (None outside the grid)."""
        lines = self.lines(axis)
        return next((line for line in lines if self.rank in line), None)

    def group(self, axis: str):
        """This rank's torch group along ``axis`` (None outside). Collective over the torch world (see module)."""
        return group_of(self.lines(axis))

    def comm(self, axis: str):
        """This rank's mpi4py communicator along ``axis`` (None outside). Collective over that line only."""
        line = self.ranks(axis)
        return None if line is None else comm_of(line)

    def device_mesh(self, device):
        """A torch DeviceMesh over the grid, dims named after the axes, built on the cached groups.

        ``device``: the rank's device (or its type, ``"cpu"``/``"cuda"``), e.g. ``dist.init().device``.
        Collective like :meth:`group`; None outside the grid."""
        from torch.distributed.device_mesh import DeviceMesh

        dtype = torch.device(device).type
        groups = [self.group(a) for a in self.names]          # every rank takes part, in axis order
        key = (self.names, self.sizes, self.n, dtype)
        if self.inside and key not in _TORCH["meshes"]:
            mesh = torch.arange(self.n).view(*self.sizes)
            _TORCH["meshes"][key] = (DeviceMesh.from_group(groups[0], dtype, mesh_dim_names=self.names)
                                     if len(groups) == 1 else
                                     DeviceMesh.from_group(groups, dtype, mesh, mesh_dim_names=self.names))
        return _TORCH["meshes"].get(key)


def build(first: int | None = None, **axes: int) -> Grid:
    """This rank's view of the grid ``arange(n).view(*sizes)`` with the named ``axes`` (outermost first).

    ``first``: lay the grid over ranks ``0 .. first-1`` only (default: the whole world). Makes no group: those
    are made, and cached, when asked for (:meth:`Grid.group`, :meth:`Grid.comm`, :meth:`Grid.device_mesh`).
    """
    _follow_torch_world()
    world, rank = _world_and_rank()
    n = world if first is None else first
    if not 1 <= n <= world:
        raise ValueError(f"first={first} must be between 1 and the world size {world}")
    names, sizes = _sizes(axes, n)
    return Grid(names, sizes, n, rank)
