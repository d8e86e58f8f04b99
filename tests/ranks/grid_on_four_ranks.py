"""test_grid: ddlcourse.grid on 4 ranks: rank lines, collectives over groups and communicators, cached groups,
the DeviceMesh, the default axis, a grid over the first ranks, refused layouts and a new torch world; rank 0
prints GRID OK."""
import torch, torch.distributed as t
from mpi4py import MPI
from ddlcourse import dist, grid

info = dist.init()
r = info.rank
made = []                                  # every new_group call, counted
real = t.new_group
def counting(*a, **k):
    made.append(k.get("ranks"))
    return real(*a, **k)
t.new_group = counting

def total_torch(group):
    x = torch.tensor([float(r)]); t.all_reduce(x, group=group); return int(x.item())

# dp x tp: the tp lines are the rows, the dp lines the columns of arange(4).view(2, 2)
view = torch.arange(4).view(2, 2)
g = grid.build(dp=2, tp=2)
d, p = g.coord("dp"), g.coord("tp")
assert view[d, p] == r
assert g.ranks("tp") == view[d].tolist() and g.ranks("dp") == view[:, p].tolist(), (r, g.ranks("tp"), g.ranks("dp"))
for a in ("dp", "tp"):
    assert total_torch(g.group(a)) == sum(g.ranks(a)), (r, a)
    assert g.comm(a).allreduce(r) == sum(g.ranks(a)) and g.comm(a).Get_rank() == g.coord(a), (r, a)
n_made = len(made)
assert n_made == 4, made                   # two rows and two columns, once

# pp x dp: the dp lines are the rows, the pp lines the columns
h = grid.build(pp=2, dp=2)
s, q = h.coord("pp"), h.coord("dp")
assert view[s, q] == r
assert h.ranks("dp") == view[s].tolist() and h.ranks("pp") == view[:, q].tolist()
for a in ("pp", "dp"):
    assert total_torch(h.group(a)) == sum(h.ranks(a)) and h.comm(a).allreduce(r) == sum(h.ranks(a)), (r, a)
# the same rank lines as before: the cached groups and communicators, no new_group call
assert len(made) == n_made, made
assert h.group("pp") is g.group("dp") and h.group("dp") is g.group("tp") and h.comm("pp") is g.comm("dp")
again = grid.build(dp=2, tp=2)
assert again.group("dp") is g.group("dp") and again.comm("tp") is g.comm("tp") and len(made) == n_made

# the DeviceMesh: the same layout, names and groups
m = g.device_mesh("cpu")
assert m.mesh.tolist() == view.tolist() and m.mesh_dim_names == ("dp", "tp")
assert m["tp"].get_group() is g.group("tp") and m["dp"].get_group() is g.group("dp") and len(made) == n_made
assert g.device_mesh("cpu") is m

# the default axis takes what is left, outermost
assert (grid.build(tp=2).names, grid.build(tp=2).sizes) == (("dp", "tp"), (2, 2))
assert grid.build().sizes == (4,)

# a grid over the first 2 ranks: the others take part in new_group and get None
f = grid.build(first=2, dp=2)
grp, cm = f.group("dp"), f.comm("dp")
assert f.inside == (r < 2) and (grp is None) == (cm is None) == (r >= 2)
if r < 2:
    assert total_torch(grp) == 1 and cm.allreduce(r) == 1 and f.ranks("dp") == [0, 1]

errors = []
for bad in (dict(dp=3), dict(tp=3), dict(dx=2)):
    try:
        grid.build(**bad)
    except ValueError as e:
        errors.append(str(e))
assert "multiply to 3, but the grid has 4 ranks" in errors[0], errors
assert "3 does not divide 4" in errors[1] and "unknown axis name(s) ['dx']" in errors[2], errors

# a new torch world (destroyed and initialised again behind the grid's back): the old groups are dropped
t.destroy_process_group()
dist._STATE.pop("info")
dist.init()
k = grid.build(dp=2, tp=2)
assert total_torch(k.group("dp")) == sum(k.ranks("dp")) and len(made) == n_made + 2, made

res = MPI.COMM_WORLD.gather(r, root=0)
dist.shutdown()
if r == 0:
    print("GRID OK", res)
