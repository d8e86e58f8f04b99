"""ddlcourse.profiling (notebook 24, profiling a data-parallel step): interval arithmetic, the straggler rule,
Horovod's timeline, the exercise checkers, and the profiled step on 2 gloo ranks."""
import json
import random

import pytest

from ddlcourse import profiling as P
from ddlcourse import selfcheck
from ddlcourse.exercises.solutions import profiling as ex

from helpers import ROOT, module_command, run_ranks


# --------------------------------------------------------------------------- interval arithmetic
def test_union_total_subtract_by_hand():
    assert P.union([(3, 4), (0, 2), (1, 2.5)]) == [(0, 2.5), (3, 4)]
    assert P.total([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4.0)
    assert P.subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert P.subtract([(0, 1)], [(-1, 2)]) == []
    assert P.exposed_comm([(2, 5), (4.5, 7.5), (9, 10.5), (10, 11)], [(0, 4), (3, 6), (7, 9)]) == pytest.approx(3.0)
    assert P.exposed_comm([], [(0, 1)]) == 0.0
    with pytest.raises(ValueError, match="ends before it starts"):
        P.union([(2, 1)])


def test_exposed_comm_matches_a_sampled_measure():
    """Against a brute-force count on a fine grid of random intervals."""
    rng = random.Random(7)
    for _ in range(20):
        def rand_iv(k):
            out = []
            for _ in range(k):
                a = rng.randint(0, 90)
                out.append((a / 10, (a + rng.randint(1, 30)) / 10))
            return out
        comm, comp = rand_iv(rng.randint(1, 5)), rand_iv(rng.randint(0, 5))
        grid = [i / 100 + 0.005 for i in range(1300)]          # midpoints of 0.01-wide cells up to 13
        covered = sum(1 for g in grid if any(a <= g < b for a, b in comm) and not any(a <= g < b for a, b in comp))
        assert P.exposed_comm(comm, comp) == pytest.approx(covered / 100, abs=1e-9)


def test_find_straggler():
    assert P.find_straggler([0.3, 0.01, 0.29]) == 1
    assert P.find_straggler({0: 0.4, 3: 0.02, 5: 0.41}) == 3
    with pytest.raises(ValueError):
        P.find_straggler([])


# --------------------------------------------------------------------------- Horovod's timeline
def test_horovod_timeline_parsing(tmp_path):
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.w"}},
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 100, "pid": 1},
        {"ph": "E", "ts": 400, "pid": 1},
        {"ph": "B", "name": "ALLREDUCE", "ts": 500, "pid": 1},
        {"ph": "B", "name": "MPI_ALLREDUCE", "ts": 600, "pid": 1},
        {"ph": "E", "ts": 800, "pid": 1},
        {"ph": "E", "ts": 1500, "pid": 1},
    ]
    path = tmp_path / "tl.json"
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",")    # a job that died: no "]"
    got = P.read_horovod_timeline(path)
    assert got == events
    ph = P.horovod_phases(got)
    assert ph == pytest.approx({"NEGOTIATE_ALLREDUCE": 300e-6, "ALLREDUCE": 1000e-6, "MPI_ALLREDUCE": 200e-6})
    assert P.horovod_tensors(got) == ["allreduce.w"]


def test_horovod_timeline_job(tmp_path):
    """A fresh 2-rank Horovod job writes a timeline with the allreduce phases."""
    path = P.run_horovod_timeline(tmp_path / "tl.json", n=2, dim=8, hidden=16, depth=1, batch=8, steps=2)
    ph = P.horovod_phases(P.read_horovod_timeline(path))
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= set(ph)
    assert all(v >= 0 for v in ph.values())


# --------------------------------------------------------------------------- the exercise checkers
def test_exposed_comm_checker():
    assert selfcheck.run_checker("exposed_comm", P.exposed_comm).ok
    msg = selfcheck.run_checker("exposed_comm", ex._all_comm).message
    assert "without taking off" in msg
    assert "subtract the union of the compute" in selfcheck.run_checker("exposed_comm", ex._union_only).message
    assert "subtracted all compute time" in selfcheck.run_checker("exposed_comm", ex._minus_compute_total).message
    assert "merge the communication intervals" in selfcheck.run_checker("exposed_comm", ex._no_union).message
    assert "as a number" in selfcheck.run_checker("exposed_comm", lambda a, b: None).message

    def unwritten(*a):
        raise NotImplementedError
    assert "not written yet" in selfcheck.run_checker("exposed_comm", unwritten).message


def test_find_straggler_checker():
    assert selfcheck.run_checker("find_straggler", P.find_straggler).ok

    def longest(w):
        items = w.items() if isinstance(w, dict) else enumerate(w)
        return max(items, key=lambda kv: kv[1])[0]
    assert "waits longest" in selfcheck.run_checker("find_straggler", longest).message
    assert not selfcheck.run_checker("find_straggler", lambda w: 0).ok


# --------------------------------------------------------------------------- the plot
def test_plot_step_draws_every_phase():
    import matplotlib
    matplotlib.use("Agg")
    step = [("forward", "forward", 0.0, 0.01), ("backward", "backward", 0.01, 0.03),
            ("gloo:all_reduce", "allreduce", 0.015, 0.02), ("optimizer", "optimizer", 0.03, 0.031)]
    res = [dict(rank=r, steps=[step]) for r in range(2)]
    ax = P.plot_step(res)
    assert len(ax.patches) == 8                               # 3 phases + 1 allreduce, per rank
    assert [t.get_text() for t in ax.get_legend().get_texts()][-1].startswith("allreduce")


def test_profile_step_needs_init():
    import subprocess
    subprocess.run(module_command("profiling_needs_init"), check=True, timeout=120, cwd=ROOT)


# --------------------------------------------------------------------------- on 2 gloo ranks


def test_profile_step_on_two_ranks(tmp_path):
    out = run_ranks(2, "profiling_step_on_two_ranks", env={"TRACE_DIR": str(tmp_path)}).stdout
    assert "rank 0: serial_comm True ddp_comm True events True trace True" in out, out
    assert "rank 1: serial_comm None ddp_comm True events True trace True" in out, out
    assert out.count("same True") == 2, out
    assert "straggler 1" in out, out
    trace = json.loads((tmp_path / "rank0.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"forward", "backward", "optimizer", "gloo:all_reduce"} <= names


def test_gpu_steps_count_each_range_once_and_time_the_kernels():
    """On a GPU the profiler copies every record_function range onto the device timeline, and the host-side
    nccl:all_reduce only times the launch: steps are split on the host's ranges, the allreduce and compute are
    the device's kernels, and the launch still counts as the step's collective call. A step ends at its mark,
    so the next step's barrier (NCCL's allreduce of one number, a kernel that waits for the last rank) is in no
    step."""
    from types import SimpleNamespace as NS

    import numpy as np

    from torch.autograd import DeviceType

    def ev(name, a, b, dev=DeviceType.CPU):
        return NS(name=name, device_type=dev, time_range=NS(start=a, end=b))
    cuda = DeviceType.CUDA
    events = []
    for s in range(2):
        o = s * 1000
        events += [ev("sync", o, o + 10), ev("sync", o, o + 12, cuda),            # host range and its device copy
                   ev("forward", o + 10, o + 100), ev("forward", o + 11, o + 105, cuda),
                   ev("backward", o + 100, o + 300), ev("backward", o + 101, o + 420, cuda),
                   ev("nccl:all_reduce", o + 200, o + 205),                      # the launch only
                   ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL", o + 250, o + 400, cuda),
                   ev("sm80_xmma_gemm", o + 120, o + 280, cuda),
                   ev("step end", o + 430, o + 430)]                              # after the synchronize
    events.append(ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1001, 1009, cuda))   # step 1's barrier
    steps = P._step_events(events, 2, device_timeline=True)
    assert len(steps) == 2
    first = steps[0]
    assert [k for _, k, _, _ in first].count("forward") == 1 and [k for _, k, _, _ in first].count("backward") == 1
    assert np.allclose(P.intervals(first, "allreduce"), [(0.00024, 0.00039)])
    assert np.allclose(P.intervals(first, "compute"), [(0.00011, 0.00027)])
    for step in steps:                      # DDP's allreduce, and not the next step's barrier
        assert np.allclose(P.intervals(step, "allreduce"), [(0.00024, 0.00039)]), step
    assert [P.collective_calls(s) for s in steps] == [1, 1]
    host = P._step_events(events, 2)          # a CPU run would take the host-side collective
    assert np.allclose(P.intervals(host[0], "allreduce"), [(0.00019, 0.000195)])
    with pytest.raises(RuntimeError, match="1 'step end' marks"):
        P._step_events([e for e in events if not (e.name == "step end" and e.time_range.start > 1000)], 2)


def test_a_step_ends_before_the_next_steps_barrier(tmp_path):
    """On CPU ranks, the barrier made NCCL's (an allreduce of one number, whose wait for the last rank is then
    allreduce time): each profiled step holds DDP's one allreduce call and no barrier's, although the profiler
    recorded all of them (a step used to run up to the end of the next barrier)."""
    out = run_ranks(2, "profiling_step_window", env={"TRACE_DIR": str(tmp_path)}).stdout
    assert "barriers 4" in out and "allreduce events in the trace 8" in out, out   # 4 barriers + DDP's 4 steps
    assert "calls per step [1, 1, 1]" in out, out
