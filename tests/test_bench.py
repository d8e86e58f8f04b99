import math

import pytest

from ddlcourse import bench


def test_strong_scaling_known_answer():
    rows = bench.scaling_table({1: 1.0, 2: 0.5, 4: 0.4}, mode="strong", samples=64)
    assert [r.speedup for r in rows] == [1.0, 2.0, 2.5]
    assert [r.efficiency for r in rows] == [1.0, 1.0, 0.625]
    assert rows[0].throughput == 64.0 and rows[2].throughput == 160.0


def test_weak_scaling_known_answer():
    # per-rank batch fixed at 32: global batch 32, 64, 128; step time grows a little
    rows = bench.scaling_table({1: 1.0, 2: 1.0, 4: 1.25}, mode="weak", samples=32)
    assert [r.throughput for r in rows] == [32.0, 64.0, 102.4]
    assert [round(r.efficiency, 3) for r in rows] == [1.0, 1.0, 0.8]


def test_baseline_other_than_one_rank():
    rows = bench.scaling_table({2: 1.0, 8: 0.5})
    assert rows[1].speedup == 2.0 and rows[1].efficiency == 0.5


@pytest.mark.parametrize("bad", [{}, {0: 1.0}, {1: 0.0}, {1: -1.0}])
def test_bad_input(bad):
    with pytest.raises(ValueError):
        bench.scaling_table(bad)


def test_time_steps_counts_and_warmup():
    calls = []
    st = bench.time_steps(lambda: calls.append(1), n_steps=5, warmup=3, samples_per_step=10)
    assert len(calls) == 8 and len(st.times) == 5
    assert st.median >= 0 and (math.isnan(st.throughput) or st.throughput > 0)
    with pytest.raises(ValueError):
        bench.time_steps(lambda: None, n_steps=0)


def test_plot_scaling_draws_ideal_and_measured():
    import matplotlib
    matplotlib.use("Agg")
    ax = bench.plot_scaling(bench.scaling_table({1: 1.0, 2: 0.6}))
    assert len(ax.lines) == 2
    assert "%" in bench.format_table(bench.scaling_table({1: 1.0, 2: 0.6}))
