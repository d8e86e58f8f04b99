"""The coding exercises of notebook 13 (scaling): speedup and efficiency from measured step times, and the
distributed step timer. tests/test_build_it.py runs every checker on its solution, each typical mistake and
the notebook's template, on real ranks."""
from ddlcourse import bench
from ddlcourse.exercises.checkers import scaling as ex
from ddlcourse.selfcheck import run_checker


def test_strong_scaling_accepts_the_package_reference():
    v = run_checker("strong_scaling", lambda t: {r.ranks: (r.speedup, r.efficiency)
                                                 for r in bench.scaling_table(t, "strong")})
    assert v.ok, v.message


def test_fake_device_runs_asynchronously_on_its_simulated_clock():
    dev = ex.FakeDevice(rank=2, warmup=1)          # a step takes 1 + 0.5 * 2 = 2 s, the warm-up one 2 s more
    dev.step()
    assert dev.clock() == ex.FakeDevice.LAUNCH     # step() only queued the work
    dev.sync()
    assert abs(dev.clock() - (ex.FakeDevice.LAUNCH + 4.0)) < 1e-12
    t0 = dev.clock()
    dev.step()
    dev.sync()
    assert abs(dev.clock() - t0 - (ex.FakeDevice.LAUNCH + 2.0)) < 1e-12
