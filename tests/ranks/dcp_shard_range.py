"""test_dcp: dcp.shard_range gives the rows FSDP2's fully_shard keeps on each rank; each rank prints ROWS and
True or False per size."""
import torch
from torch import nn
from ddlcourse import dist, dcp
from torch.distributed.fsdp import fully_shard
from torch.distributed.device_mesh import init_device_mesh
dist.init()
r, n = torch.distributed.get_rank(), torch.distributed.get_world_size()
mesh = init_device_mesh('cpu', (n,))
for rows in (10, 3, 64):
    m = nn.Linear(5, rows); fully_shard(m, mesh=mesh)
    a, b = dcp.shard_range(rows, n, r)
    print('ROWS', rows, m.weight.to_local().shape[0] == b - a)
