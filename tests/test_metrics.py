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


def test_forgetting_takes_the_best_earlier_accuracy_not_the_first():
    """A task whose accuracy rose after it was learnt (70 after task 1, 60 right after task 0): forgetting measures
    from the best, so it differs from −BWT, which measures from the diagonal."""
    m = make([([60], [100]), ([70, 90], [100, 100]), ([50, 80, 70], [100, 100, 100])])
    s = m.summary()
    assert s["forgetting"] == pytest.approx(((70 - 50) + (90 - 80)) / 2)  # 15
    assert s["bwt"] == pytest.approx(((50 - 60) + (80 - 90)) / 2)  # -10


def test_every_summary_of_a_protocol_with_a_large_first_task():
    """50%-base style test sets (500, 100, 100 images): per-image metrics weigh tasks by their images, the
    task-averaged ones weigh each task alike, and forgetting weighs each earlier task alike."""
    m = make([([400], [500]), ([300, 90], [500, 100]), ([250, 60, 80], [500, 100, 100])])
    s = m.summary()
    assert s["acc_per_task"] == pytest.approx([80, 65, 100 * 390 / 700])
    assert s["last_acc"] == pytest.approx(100 * 390 / 700)  # 55.71
    assert s["avg_inc_acc"] == pytest.approx((80 + 65 + 100 * 390 / 700) / 3)
    assert s["acc_per_task_task_avg"] == pytest.approx([80, 75, 190 / 3])
    assert s["last_acc_task_avg"] == pytest.approx(190 / 3)
    assert s["avg_inc_acc_task_avg"] == pytest.approx((80 + 75 + 190 / 3) / 3)
    assert s["old_acc"][1] == pytest.approx(60) and s["old_acc"][2] == pytest.approx(100 * 310 / 600)  # per image
    assert s["new_acc"] == [80, 90, 80] and s["forgetting"] == pytest.approx(((80 - 50) + (90 - 60)) / 2)


def test_evaluation_counts_do_not_depend_on_the_batch_size():
    """The last, partial batch is evaluated like the others: any batch size gives the same counts."""
    import torch

    from dfcil.data.device import Normalizer
    from dfcil.models.network import NetOutput
    from dfcil.training.protocol import TestSet

    class Toy(torch.nn.Module):
        def forward(self, x):  # a fixed, input-dependent guess among 3 classes
            logits = torch.stack([x[:, 0, 0, 0], x[:, 1, 0, 0], x[:, 2, 0, 0]], dim=1)
            return NetOutput(logits, x.flatten(1), ())

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (7, 2, 2, 3), dtype=torch.uint8, generator=g)
    y = torch.tensor([0, 0, 0, 1, 1, 2, 2])  # sorted by label; tasks: {0}, {1, 2}
    tests = TestSet(x, y, np.array([3, 7]), torch.tensor([0, 1, 1]), Normalizer((0.5,) * 3, (0.25,) * 3, x.device))
    pred = Toy()(tests.normalizer(x)).logits.argmax(1)
    expected = [int((pred[:3] == y[:3]).sum()), int((pred[3:] == y[3:]).sum())]
    for batch_size in (1, 2, 3, 4, 7, 100):
        correct, count = tests.evaluate(Toy(), 1, batch_size)
        assert correct.tolist() == expected and count.tolist() == [3, 4], batch_size
