"""test_dcp: a checkpoint saved at step 2 (to ``sys.argv[1]``) loaded for a phase that starts at step 3 is
refused; each rank prints REFUSED and the message."""
import sys

from ddlcourse import dist, dcp
dist.init()
dcp.train_phase(0, 2, save_to=sys.argv[1])
try:
    dcp.train_phase(3, 4, load_from=sys.argv[1])
except ValueError as e:
    print('REFUSED', e)
