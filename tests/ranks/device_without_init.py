"""test_device_placement: every rank asks device.rank_device() without torch.distributed (as a parameter server's
worker or a search's trial does), with CUDA faked to show 4 GPUs; rank 0 prints each rank's answer, then whether
any rank changed its current CUDA device."""
import torch
from mpi4py import MPI

from ddlcourse import device

torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 4
current = []
torch.cuda.set_device = current.append
got = MPI.COMM_WORLD.gather(str(device.rank_device()), root=0)
changed = MPI.COMM_WORLD.gather(bool(current), root=0)
if MPI.COMM_WORLD.Get_rank() == 0:
    print(" ".join(got))
    print("current device changed:", any(changed))
