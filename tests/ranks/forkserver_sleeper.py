"""test_forkserver: each rank prints its pid, then sleeps for two minutes (until mpiexec is killed)."""
import os, time
print(os.getpid(), flush=True)
time.sleep(120)
