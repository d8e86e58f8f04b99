"""The coding exercise of notebook 03 (loss integrity): each rank's share of the global-mean loss."""
import pytest

from ddlcourse import losses
from ddlcourse.exercises.solutions import loss_integrity as ex
from ddlcourse.selfcheck import run_checker


def test_global_mean_loss_accepts_reference_and_hand_written():
    assert run_checker("global_mean_loss", losses.global_mean_loss).ok
    assert run_checker("global_mean_loss", lambda per_sample, M, N: N * per_sample.sum() / M).ok


@pytest.mark.parametrize("wrong, hint", [(ex._mean_of_means, "own mean"), (ex._no_world_size, "factor world_size"),
                                         (ex._plain_sum, "returned the rank's sum"),
                                         (ex._local_count, "rank's own count")])
def test_global_mean_loss_names_mistakes(wrong, hint):
    v = run_checker("global_mean_loss", wrong)
    assert not v.ok and hint in v.message, v.message


def test_global_mean_loss_unwritten_and_unknown_wrong():
    def skeleton(per_sample, M, N):
        raise NotImplementedError
    assert "not written yet" in run_checker("global_mean_loss", skeleton).message
    v = run_checker("global_mean_loss", lambda per_sample, M, N: 2 * per_sample.sum() / M)
    assert not v.ok and "differs from the reference" in v.message


def test_forgotten_set_epoch_repeats_the_first_order_and_bends_the_curve_after_epoch_one():
    from ddlcourse import integrity, sharding

    cfg = integrity.make_config(n_samples=70, global_batch=16, epochs=2)
    e1 = integrity.step_batches(cfg, "no_set_epoch", 0, 2, epoch=1)
    assert all((a == b).all() for a, b in zip(e1, integrity.step_batches(cfg, "none", 0, 2, epoch=0)))
    assert any(len(a) != len(b) or (a != b).any()
               for a, b in zip(e1, sharding.sharded_batches(70, 16, 0, 2, epoch=1)))
    ref = integrity.serial(n_samples=70, global_batch=16, epochs=2)
    bad = integrity.serial("no_set_epoch", n_samples=70, global_batch=16, epochs=2)
    steps = len(ref) // 2
    assert integrity.max_difference(ref[:steps], bad[:steps]) == 0          # epoch 0 is the same
    assert integrity.max_difference(ref[steps:], bad[steps:]) > 1e-6        # then the orders differ
