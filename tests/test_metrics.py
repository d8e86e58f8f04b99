"""Known answers for the metrics, and their reduction across ranks equals the metric of the whole set."""
import numpy as np
import pytest

from ddlcourse import metrics

from helpers import run_ranks


def test_confusion_and_segmentation_known_answer():
    t = np.array([0, 0, 1, 1, 2, 2])
    p = np.array([0, 1, 1, 1, 2, 0])
    cm = metrics.confusion_matrix(p, t, 3)
    assert cm.tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    s = metrics.segmentation_scores(cm)
    assert s["pixel_acc"] == pytest.approx(4 / 6)
    assert s["mean_class_acc"] == pytest.approx((0.5 + 1 + 0.5) / 3)
    iou = [1 / 3, 2 / 3, 1 / 2]
    assert s["iou_per_class"] == pytest.approx(iou)
    assert s["mean_iou"] == pytest.approx(np.mean(iou))
    assert s["fw_iou"] == pytest.approx(np.dot([2 / 6] * 3, iou))


def test_classification_scores_known_answer():
    cm = np.array([[8, 2], [1, 1]])   # class 1 rare
    s = metrics.classification_scores(cm)
    assert s["accuracy"] == pytest.approx(9 / 12)
    assert s["recall"] == pytest.approx([0.8, 0.5])
    assert s["balanced_acc"] == pytest.approx(0.65)
    f1 = [2 * (8 / 9) * 0.8 / (8 / 9 + 0.8), 2 * (1 / 3) * 0.5 / (1 / 3 + 0.5)]
    assert s["macro_f1"] == pytest.approx(np.mean(f1))
    # majority-class predictor: balanced accuracy 0.5, macro-F1 well below accuracy
    maj = metrics.classification_scores(np.array([[10, 0], [2, 0]]))
    assert maj["balanced_acc"] == 0.5 and maj["macro_f1"] < maj["accuracy"]


def test_ignore_index_and_bad_labels():
    cm = metrics.confusion_matrix([0, 1, 1], [0, 255, 1], 2, ignore_index=255)
    assert cm.sum() == 2
    with pytest.raises(ValueError, match="labels must lie"):
        metrics.confusion_matrix([0, 3], [0, 1], 2)
    with pytest.raises(ValueError, match="differ in size"):
        metrics.confusion_matrix([0], [0, 1], 2)


def test_auroc_and_ap_known_answers():
    y = [1, 1, 0, 0]
    assert metrics.roc_auc([0.9, 0.8, 0.3, 0.1], y) == 1.0
    assert metrics.roc_auc([0.1, 0.2, 0.8, 0.9], y) == 0.0
    assert metrics.roc_auc([0.5, 0.5, 0.5, 0.5], y) == 0.5
    assert metrics.roc_auc([0.9, 0.2, 0.5, 0.1], y) == 0.75
    # positives at ranks 1 and 3: AP = (1/1 + 2/3) / 2
    assert metrics.average_precision([0.9, 0.5, 0.7, 0.1], y) == pytest.approx((1 + 2 / 3) / 2)
    with pytest.raises(ValueError):
        metrics.roc_auc([0.1, 0.2], [1, 1])


@pytest.mark.mpi
def test_metrics_reduced_over_uneven_shards_equal_whole_set():
    assert run_ranks(3, "metrics_uneven_shards").stdout.strip() == "True"


# --------------------------------------------------------------------------- instance segmentation (lab 1): known answers
def test_iou_matrix_and_greedy_match():
    gt = np.array([[1, 1, 0, 2, 2]])
    pred = np.array([[1, 1, 1, 2, 0]])
    iou = metrics.iou_matrix(pred, gt)
    assert np.allclose(iou, [[2 / 3, 0], [0, 0.5]])
    tp, m = metrics.match(iou, np.array([0.9, 0.8]), 0.5)
    assert tp.tolist() == [True, True] and np.allclose(m, [2 / 3, 0.5])
    tp, _ = metrics.match(iou, np.array([0.9, 0.8]), 0.6)
    assert tp.tolist() == [True, False]
    # two predictions on one true instance: the higher score wins, the other is a false positive
    tp, _ = metrics.match(np.array([[0.7], [0.9]]), np.array([0.2, 0.8]), 0.5)
    assert tp.tolist() == [False, True]


def test_average_precision_known_answers():
    ap = metrics.average_precision_from_matches
    assert ap([0.9, 0.8], [True, True], 2) == pytest.approx(1.0)
    assert ap([0.9, 0.8, 0.7], [True, False, True], 2) == pytest.approx(0.5 + 0.5 * 2 / 3)
    assert ap([0.9, 0.8, 0.7], [True, False, True], 4) == pytest.approx(0.25 + 0.25 * 2 / 3)
    assert ap([0.9, 0.8], [False, True], 1) == pytest.approx(0.5)
    assert ap([], [], 3) == 0.0
    with pytest.raises(ValueError):
        ap([0.5], [True], 0)


def test_instance_stats_over_two_ranks_equal_serial():
    assert "OK" in run_ranks(2, "metrics_instance_stats").stdout
