"""ddlcourse.hpsearch: deterministic trials, correct halving arithmetic, the same results on 1 and 2 engines."""
import math

import pytest
import torch

from ddlcourse import hpsearch as hp

torch.set_num_threads(1)  # tiny models: threads only add overhead (engines use 1 too)

SMALL = dict(n_train=512, n_val=256)


def test_sample_configs_reproducible_and_in_space():
    a, b = hp.sample_configs(20, seed=3), hp.sample_configs(20, seed=3)
    assert a == b and [c["trial"] for c in a] == list(range(20))
    assert a != hp.sample_configs(20, seed=4)
    for c in a:
        assert 1e-3 <= c["lr"] <= 1.0
        assert c["momentum"] in hp.SPACE["momentum"][1]
        assert c["batch_size"] in hp.SPACE["batch_size"][1]
        assert c["warmup"] in hp.SPACE["warmup"][1]
    with pytest.raises(ValueError):
        hp.sample_configs(0)


def test_trial_deterministic_and_learns():
    cfg = {"trial": 5, "lr": 0.1, "momentum": 0.9, "batch_size": 32, "warmup": 10}
    r1, r2 = hp.train_trial(cfg, 1024, SMALL), hp.train_trial(cfg, 1024, SMALL)
    assert r1["val_loss"] == r2["val_loss"] and r1["steps"] == 32
    chance = math.log(hp.TASK["n_classes"])
    assert r1["val_loss"] < chance - 0.1                     # a good config beats guessing
    bad = hp.train_trial({**cfg, "lr": 1e6, "warmup": 0}, 1024, SMALL)
    assert bad["diverged"] and bad["val_loss"] == float("inf")
    with pytest.raises(ValueError, match="lacks"):
        hp.train_trial({"lr": 0.1}, 64, SMALL)


def test_successive_halving_keeps_the_best():
    cfgs = hp.sample_configs(9, seed=1)
    rungs = hp.successive_halving(cfgs, 64, eta=3, view=None, progress=False, task=SMALL)
    assert [len(r) for r in rungs] == [9, 3, 1]
    assert [r[0]["budget"] for r in rungs] == [64, 192, 576]
    for prev, nxt in zip(rungs, rungs[1:]):
        assert {r["trial"] for r in nxt} == {r["trial"] for r in hp.top_k(prev, len(nxt))}
    spent = sum(r["budget"] for rung in rungs for r in rung)
    assert spent == hp.sh_total_budget(9, 64, 3)


def test_budget_arithmetic():
    assert hp.sh_total_budget(27, 1, 3) == 27 + 9 * 3 + 3 * 9 + 1 * 27
    assert hp.sh_total_budget(27, 1, 3, max_budget=9) == 27 + 27 + 27
    assert hp.hyperband_brackets(81, 1, 3) == [(81, 1), (34, 3), (15, 9), (8, 27), (5, 81)]  # Li et al. 2018, Table 1


def test_scaling_exponent_known_answer():
    # best lr doubles when the batch doubles -> exponent 1 (linear rule)
    res = [{"trial": i, "batch_size": b, "lr": lr, "val_loss": abs(math.log(lr / (0.01 * b)))}
           for i, (b, lr) in enumerate((b, lr) for b in (16, 32, 64) for lr in (0.08, 0.16, 0.32, 0.64, 1.28))]
    assert hp.best_lr_per_batch(res) == {16: 0.16, 32: 0.32, 64: 0.64}
    assert hp.scaling_exponent(res) == pytest.approx(1.0)


@pytest.mark.slow
def test_load_balanced_view_same_results_on_1_and_2_engines():
    from ddlcourse import cluster
    cfgs = hp.sample_configs(6, seed=2)
    serial = {r["trial"]: r["val_loss"] for r in hp.run_trials(cfgs, 256, None, task=SMALL, progress=False)}
    with cluster.MPICluster(n=2, quiet=True) as c:
        ids = c.client.ids
        one = hp.run_trials(cfgs, 256, c.client.load_balanced_view(targets=ids[:1]), task=SMALL, progress=False)
        two = hp.run_trials(cfgs, 256, c.client.load_balanced_view(targets=ids), task=SMALL, progress=False)
    assert {r["engine"] for r in one} == {ids[0]}
    assert {r["engine"] for r in two} <= set(ids)
    for res in (one, two):
        assert sorted(r["trial"] for r in res) == list(range(6))
        assert {r["trial"]: r["val_loss"] for r in res} == serial
