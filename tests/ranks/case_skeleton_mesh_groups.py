"""test_case_skeleton: training.setup's process groups on a 2x2 mesh are built once and reused, reduce over the
right ranks, and a run on 2 of 4 ranks leaves the others out; rank 0 prints OK<rank> of every rank."""
import torch, torch.distributed as tdist
from ddlcourse import dist, sharding, training
from ddlcourse.cases import topology
calls = []
real = tdist.new_group
def counting(*a, **k):
    calls.append(1)
    return real(*a, **k)
tdist.new_group = counting
cfg = topology.Config.make("smoke")
a = training.setup(cfg, mesh=(2, 2))
n_first = len(calls)
b = training.setup(cfg, mesh=(None, 2))
g, h = a.grid, b.grid
assert len(calls) == n_first >= 4, (len(calls), n_first)   # 2 rows + 2 columns, once (ddlcourse.grid caches them)
assert [h.group(x) for x in ("dp", "mp")] + [h.comm(x) for x in ("dp", "mp")] ==     [g.group(x) for x in ("dp", "mp")] + [g.comm(x) for x in ("dp", "mp")]
assert len(calls) == n_first                                # asking again makes nothing
assert (a.dp, a.mp, g.coord("dp"), g.coord("mp")) == (2, 2, a.rank // 2, a.rank % 2)
assert g.ranks("mp") == [2 * g.coord("dp"), 2 * g.coord("dp") + 1] and g.ranks("dp") == [g.coord("mp"), g.coord("mp") + 2]
t = torch.tensor([float(a.rank)])
tdist.all_reduce(t, group=g.group("dp"))           # the same part of both replicas: ranks j and j + 2
u = torch.tensor([float(a.rank)])
tdist.all_reduce(u, group=g.group("mp"))           # one replica: ranks 2i and 2i + 1
assert t.item() == 2 * g.coord("mp") + 2 and u.item() == 4 * g.coord("dp") + 1
assert g.comm("dp").allreduce(a.rank) == t.item() and g.comm("mp").allreduce(a.rank) == u.item()
assert a.mean(float(a.rank)) == 1.5 and a.max(a.rank) == 3 and a.sum(a.rank) == 6
sub = training.setup(topology.Config.make("smoke", ranks=2))   # ranks 2 and 3 are not in this run
assert (sub is None) == (a.rank >= 2)
if sub is not None:
    share = [sub.batches(10, 4, 0)]
    both = sub.comm.allgather(share)
    assert sorted(int(i) for s in both for i in s[0][0]) == sorted(sharding.global_batches(10, 4, 0)[0])
oks = a.comm.gather(f"OK{a.rank}", root=0)   # one print: ranks' stdout would interleave
if a.rank == 0:
    print(" ".join(oks))
dist.shutdown()
