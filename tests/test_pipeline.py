"""Pipeline schedules (GPipe, 1F1B) against the serial model; schedule shapes; torch.distributed.pipelining."""
import pytest

from ddlcourse.parallel.pipeline import predicted_bubble, schedule_order

from helpers import run_ranks


@pytest.mark.parametrize("n", [2, 3])
def test_pipeline_matches_serial(n):
    p = run_ranks(n, "pipeline_vs_serial")
    out = p.stdout
    assert float(out.split("WORST")[1].split()[0]) < 1e-5, out
    g, f = map(int, out.split("INFL")[1].split()[:2])
    assert g == 4 and f == min(n, 4), out          # 1F1B holds at most num_stages micro-batches on stage 0


def test_schedule_order():
    for sched in ("gpipe", "1f1b"):
        for s in range(4):
            order = schedule_order(sched, s, 4, 6)
            assert sorted(order) == sorted([("F", i) for i in range(6)] + [("B", i) for i in range(6)])
            for i in range(6):
                assert order.index(("F", i)) < order.index(("B", i))
    assert schedule_order("1f1b", 3, 4, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert predicted_bubble(4, 4) == pytest.approx(3 / 7)
    with pytest.raises(ValueError):
        schedule_order("zigzag", 0, 2, 2)


def test_same_as_torch_pipelining():
    p = run_ranks(2, "pipeline_same_as_torch_pipelining")
    assert float(p.stdout.split("DIFF")[1].split()[0]) < 1e-5, p.stdout + p.stderr[-2000:]


def test_emulated_work_scales_with_micro_batch():
    # Same global batch: the emulated work of the batch (3 * delay_s per stage) is the same for every m;
    # only the fixed per-micro-batch overhead (2 * m * overhead_s) grows with m.
    out = run_ranks(2, "pipeline_emulated_work").stdout
    rows = [line.split() for line in out.splitlines() if line.startswith("RANK")]
    assert len(rows) == 6, out
    for _, _, _, m, _, total, _, n in rows:
        assert int(n) == 2 * int(m)
        assert float(total) == pytest.approx(3 * 0.3 + 2 * int(m) * 0.01, rel=1e-9), out
    assert pipeline_predicted(2, 4) == pytest.approx((4 + 1) * (3 * 0.3 / 4 + 2 * 0.01))


def pipeline_predicted(p, m):
    from ddlcourse.parallel.pipeline import predicted_step_time
    return predicted_step_time(p, m, 0.3, 0.01)
