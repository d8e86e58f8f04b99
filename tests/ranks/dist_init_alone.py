"""test_dist: dist.init in a process of its own (not under mpiexec), with the environment the test gives it;
prints the device and world size, or the LaunchError."""
from ddlcourse import dist
try:
    info = dist.init()
    print('device', info.device, info.world_size)
    dist.shutdown()
except dist.LaunchError as e:
    print('LaunchError:', e)
