"""test_elastic: train_loop refuses a global batch that the ranks cannot share; each rank prints REFUSED and the
message."""
from ddlcourse import dist, elastic
import tempfile
dist.init()
try:
    elastic.train_loop(tempfile.mkdtemp(), global_batch=63)
except ValueError as e:
    print('REFUSED', e)
