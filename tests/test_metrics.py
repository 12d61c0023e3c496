import numpy as np
import pytest

from dfcil.metrics import AccuracyMatrix


def make(rows):
    m = AccuracyMatrix(len(rows))
    for i, (correct, count) in enumerate(rows):
        m.record(i, np.array(correct), np.array(count))
    return m


def test_equal_tasks():
    m = make([([80], [100]), ([50, 90], [100, 100]), ([30, 60, 70], [100, 100, 100])])
    a = m.matrix()
    assert np.isnan(a[0, 1]) and a[2].tolist() == [30, 60, 70]
    assert m.acc_per_task().tolist() == pytest.approx([80, 70, 160 / 3])
    assert m.acc_per_task_task_avg().tolist() == pytest.approx([80, 70, 160 / 3])  # equal test sets: same
    s = m.summary()
    assert s["last_acc"] == pytest.approx(53.3333)
    assert s["avg_inc_acc"] == pytest.approx((80 + 70 + 160 / 3) / 3, abs=1e-4)
    # forgetting: task 0 max(80, 50) - 30 = 50; task 1 max(90) - 60 = 30 → 40. BWT: (30-80 + 60-90)/2 = -40
    assert s["forgetting"] == pytest.approx(40) and s["bwt"] == pytest.approx(-40)
    assert s["new_acc"] == [80, 90, 70] and s["old_acc"][0] is None and s["old_acc"][2] == pytest.approx(45)


def test_weighted_and_task_averaged_differ_with_unequal_tasks():
    # half-base style: 500 test images in task 0, 100 in task 1
    m = make([([400], [500]), ([300, 90], [500, 100])])
    assert m.acc_per_task()[1] == pytest.approx(100 * 390 / 600)
    assert m.acc_per_task_task_avg()[1] == pytest.approx((60 + 90) / 2)


def test_rows_must_come_in_order_and_be_complete():
    m = AccuracyMatrix(3)
    with pytest.raises(ValueError, match="out of order"):
        m.record(1, np.array([1, 1]), np.array([2, 2]))
    with pytest.raises(ValueError, match="positive counts"):
        m.record(0, np.array([1, 1]), np.array([2, 2]))


def test_state_roundtrip():
    m = make([([8], [10]), ([5, 9], [10, 10])])
    m2 = AccuracyMatrix(2)
    m2.load_state_dict(m.state_dict())
    assert m2.summary() == m.summary()
