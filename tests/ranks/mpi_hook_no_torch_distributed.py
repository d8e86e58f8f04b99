"""test_mpi_hook: in a fresh process (not under mpiexec) without torch.distributed, MPI is usable but the hook
finds no communicator for the default group; prints ok."""
from ddlcourse import grid
from ddlcourse.parallel import mpi_hook
assert grid.mpi_usable() is not None
assert mpi_hook.comm_for(None) is None
print('ok')
