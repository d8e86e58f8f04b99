"""test_dcp: train_2d refuses dp=3 on 2 ranks; each rank prints REFUSED and the message."""
from ddlcourse import dist, dcp
dist.init()
try:
    dcp.train_2d(1, dp=3)
except ValueError as e:
    print('REFUSED', e)
