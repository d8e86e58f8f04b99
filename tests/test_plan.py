"""The budget planner: the cluster profile fits its hardware, and the planner's activation estimate is honest."""
import pytest
import torch

from ddlcourse import config, memory
from ddlcourse.tools import plan
from ddlcourse.__main__ import main as cli

OPTIMIZER_FOR_MEASURE = {"adam": "adam", "adamw": "adam", "momentum": "momentum", "sgd": "sgd", "none": "sgd"}


@pytest.mark.parametrize("section", list(plan.SECTIONS))
def test_cluster_profile_fits(section):
    row = plan.plan_section(section, "cluster")
    problems = row.overshoot()
    assert not problems, "does not fit: " + "; ".join(problems)


def test_collectives_buffers_fit_the_host():
    s = config.sizes("collectives", "cluster")                # send, receive and scratch buffer of the largest message
    assert 3 * 2 ** s.max_log2 + plan.PROCESS_OVERHEAD <= plan.HOST_BUDGET


def test_every_section_is_planned_or_explained():
    assert set(plan.SECTIONS) | set(plan.NO_DEVICE) == set(config.PROFILES)
    assert not set(plan.SECTIONS) & set(plan.NO_DEVICE)


@pytest.mark.parametrize("section", ["scaling", "lab_maize", "lab_seismic"])
def test_activation_estimate_matches_a_measured_step(section):
    """Meta-tensor estimate against a real CPU forward + backward + step (ddlcourse.memory.measure)."""
    checked = 0
    for w in plan.workloads(section, "smoke"):
        if w.prepare is not None:                             # a halo slab: not a plain model to measure
            continue
        est = plan.estimate(section, w)
        torch.manual_seed(0)
        model = w.model()
        x, y = w.batch("cpu")
        x.normal_()
        if y.is_floating_point():
            y.uniform_()
        meas = memory.measure(model, x, y, loss_fn=w.loss or torch.nn.functional.cross_entropy,
                              optimizer=OPTIMIZER_FOR_MEASURE[w.optimizer], exclude_input=False)
        assert abs(est.activations - meas["activations"]) <= 0.1 * meas["activations"], (w.label, est, meas)
        assert (est.weights, est.grads) == (meas["params"], meas["grads"]), w.label
        if w.optimizer in OPTIMIZER_FOR_MEASURE and w.optimizer != "none":
            assert est.optimizer == meas["optimizer"], w.label
        checked += 1
    assert checked >= 2


def test_estimate_grows_with_the_batch():
    small, big = (plan.estimate("t", plan.Workload("w", 1, lambda: torch.nn.Linear(8, 4), plan._cls(b, 8)))
                  for b in (16, 64))
    assert big.activations > 3 * small.activations and big.weights == small.weights


def test_unknown_optimizer_is_refused():
    w = plan.Workload("w", 1, lambda: torch.nn.Linear(8, 4), plan._cls(4, 8), optimizer="adagrad")
    with pytest.raises(ValueError, match="unknown optimizer 'adagrad'"):
        plan.estimate("t", w)


def test_cli_prints_a_row_per_section(capsys):
    rc = cli(["plan", "--scale", "smoke"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] in plan.SECTIONS]
    assert rows == [s for s in config.PROFILES if s in plan.SECTIONS]
    for name in plan.NO_DEVICE:                               # the sections without device memory, with why
        assert f"  {name}: " in out
    assert "Budgets:" in out and "meta tensors" in out


def test_cli_bad_scale(capsys):
    assert cli(["plan", "--scale", "huge"]) == 2
    assert "unknown scale 'huge'" in capsys.readouterr().err


def test_cluster_ranks_fit_the_documented_allocation():
    """env/slurm/README.md and env/GPU_CLUSTER.md document allocations of 8 GPUs, one rank per GPU."""
    over = {sec: {k: v for k, v in by_scale["cluster"].items() if k in ("n_ranks", "n_engines", "bw_ranks")
                  and v > plan.GPUS_PER_NODE}
            for sec, by_scale in config.PROFILES.items()}
    assert not {k: v for k, v in over.items() if v}, over


def test_cli_fails_and_names_what_does_not_fit(capsys, monkeypatch):
    monkeypatch.setattr(plan, "GPU_BUDGET", 2 ** 20)         # a 1 MiB GPU: the CUDA overhead alone overshoots
    assert cli(["plan", "--scale", "smoke"]) == 1
    out = capsys.readouterr().out
    assert "OVER BUDGET: loss_integrity (" in out and "GiB over the 0.00 GiB GPU" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU form: a GPU runs the measurement itself")
def test_measure_needs_a_gpu_and_says_where_it_runs(capsys):
    """``plan --measure`` is a GPU check (env/gpu_smoke.sh's 'plan'): on CPU a clear refusal, no traceback."""
    assert cli(["plan", "--scale", "smoke", "--measure"]) == 2
    err = capsys.readouterr().err
    assert "needs a GPU" in err and "gpu_smoke.sh" in err
    w = plan.workloads("data_parallel", "smoke")[0]
    with pytest.raises(ValueError, match="needs a CUDA device"):
        plan.measure_workload("data_parallel", w, "cpu")


def test_a_measured_peak_over_the_plan_is_named():
    m = plan.Measured("lab_maize", "segmentation", estimated=4 * plan.GiB, peak=6 * plan.GiB,
                      budget=5 * plan.GiB)
    assert not m.fits and m.ratio == 1.5
    assert plan.Measured("s", "w", estimated=4, peak=3, budget=5).fits


# --------------------------------------------------------------------------- disk
@pytest.mark.parametrize("section", list(plan.DISK))
def test_disk_estimate_is_what_the_generators_write(section, tmp_path, monkeypatch):
    """At smoke scale, every data set the planner counts is generated for real, each into a data cache of its
    own ($DDLCOURSE_DATA_DIR), and the bytes on disk are the estimate's (the estimate leaves out only the
    cache's few hundred bytes of settings.json)."""
    sets = plan.data_sets(section, "smoke")
    assert sets
    for i, ds in enumerate(sets):
        root = tmp_path / str(i)
        monkeypatch.setenv("DDLCOURSE_DATA_DIR", str(root))
        ds.make()
        written = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        assert written > 0 and abs(ds.bytes - written) <= 0.01 * written, (ds.label, ds.bytes, written)


def test_every_generator_that_writes_to_the_cache_is_planned():
    """A generator module that writes through ddlcourse.data.cache belongs to a section the planner gives disk."""
    from pathlib import Path
    writers = {p.stem for p in Path(plan.__file__).parents[1].joinpath("data").glob("*.py")
               if "load_or_make(" in p.read_text() and p.stem != "cache"}
    lab_of = {"seismic": "lab_seismic", "maize": "lab_maize", "driving": "lab_driving", "topology": "topology"}
    assert writers == set(lab_of), writers
    assert {lab_of[w] for w in writers} | {"data_pipeline"} == set(plan.DISK)


def test_cluster_data_outgrows_a_home_quota_and_the_plan_says_where_to_put_it(capsys, monkeypatch, tmp_path):
    """At cluster scale the labs' data sets take tens of GB (issue 45: seismic about 10 GB, driving about 9 GB); the
    plan prints each section's disk and the data cache it goes to, with the variable that moves it."""
    rows = {s: plan.plan_section(s, "cluster") for s in plan.DISK}
    assert rows["lab_seismic"].disk_bytes > 10e9 and rows["lab_driving"].disk_bytes > 9e9
    assert sum(d.bytes for r in rows.values() for d in r.disk if d.kept) > 10 * 2 ** 30   # a 10 GB home quota
    monkeypatch.setenv("DDLCOURSE_DATA_DIR", str(tmp_path / "scratch"))
    assert cli(["plan", "--scale", "smoke"]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[1].split()
    assert head[-2:] == ["disk", "fits"]
    seismic = next(line for line in out.splitlines() if line.startswith("lab_seismic "))
    assert seismic.split()[-2] == f"{plan.plan_section('lab_seismic', 'smoke').disk_bytes / plan.GiB:.2f}"
    assert f"data cache {tmp_path / 'scratch'}" in out and "set DDLCOURSE_DATA_DIR" in out
