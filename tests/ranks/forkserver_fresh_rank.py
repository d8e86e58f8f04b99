"""test_forkserver: each rank prints whether it was started fresh (its parent is not the fork server) and
torch's thread count."""
import os
PARENT = open(f'/proc/{os.getppid()}/cmdline', 'rb').read().replace(b'\0', b' ').decode()
import torch
print('fresh', 'forkserver.py' not in PARENT, torch.get_num_threads())
