"""test_profiling: profile_step in a process of its own, without dist.init, raises a RuntimeError that says so;
exits 0 if it does."""
from ddlcourse import profiling as P
try:
    P.profile_step(4, 8, 1, 4)
except RuntimeError as e:
    assert 'dist.init' in str(e)
else:
    raise SystemExit('no error')
