"""ddlcourse.grid: the one builder of process groups, on 4 real MPI ranks (mpiexec from the venv).

On the ranks: every axis's rank lines are the rows and columns of ``arange(4).view(...)``, a collective over
``group(axis)`` and over ``comm(axis)`` adds up exactly those ranks, a second build reuses the cached groups (no
``new_group`` call), the DeviceMesh is made of the same groups, and the cache follows a new torch world.
"""
import pytest

from ddlcourse import grid

from helpers import run_ranks

pytestmark = pytest.mark.mpi


def test_layout_is_arange_view():
    assert grid.layout(dp=2, tp=2) == [[0, 1], [2, 3]]
    assert grid.layout(pp=2, dp=3) == [[0, 1, 2], [3, 4, 5]]
    assert grid.layout(dp=2, pp=1, tp=2) == [[[0, 1]], [[2, 3]]]


def test_every_axis_name_has_a_meaning():
    assert set(grid.AXES) >= {"dp", "tp", "pp", "cp", "ep", "mp"} and grid.DEFAULT_AXIS in grid.AXES
    assert all(isinstance(v, str) and v for v in grid.AXES.values())


def test_bad_axis_names_and_sizes_are_refused():
    with pytest.raises(ValueError, match=r"unknown axis name\(s\) \['model'\]"):
        grid.layout(model=2)
    with pytest.raises(ValueError, match="integers >= 1"):
        grid.layout(dp=0)
    with pytest.raises(ValueError, match="multiply to 2, but the grid has 1 ranks"):
        grid.build(tp=2)                    # this process is a world of one rank


def test_grid_on_four_ranks():
    assert run_ranks(4, "grid_on_four_ranks").stdout.strip().splitlines()[-1] == "GRID OK [0, 1, 2, 3]"
