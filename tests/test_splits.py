import numpy as np
import pytest

from dfcil.data.splits import ClassIncrementalSplit, class_order_from_seed, task_sizes
from dfcil.errors import SplitError


def test_class_orders_match_abd_and_rdfcil():
    # the orders ABD and the R-DFCIL configs give (docs/reference.md, Data and protocols)
    assert class_order_from_seed(100, 0)[:10] == [23, 8, 11, 7, 48, 13, 1, 91, 94, 54]
    assert class_order_from_seed(100, 1)[:4] == [53, 37, 65, 51]
    assert class_order_from_seed(100, 2)[:4] == [0, 76, 61, 63]
    assert class_order_from_seed(200, 0)[:4] == [131, 181, 22, 172]
    assert sorted(class_order_from_seed(100, 0)) == list(range(100))


@pytest.mark.parametrize(
    ("n", "base", "expected"),
    [
        (5, 0, [20] * 5),
        (10, 0, [10] * 10),
        (20, 0, [5] * 20),
        (6, 50, [50] + [10] * 5),
        (11, 50, [50] + [5] * 10),
        (26, 50, [50] + [2] * 25),
        (6, 0, [20] + [16] * 5),  # remainder goes to the first task (cl-lite split_task)
        (1, 0, [100]),
    ],
)
def test_task_sizes(n, base, expected):
    assert task_sizes(100, n, base) == expected


@pytest.mark.parametrize(
    ("c", "n", "expected"),
    [
        (200, 3, [66, 67, 67]),  # C % N == N - 1: cl-lite gives the extra classes to the later tasks
        (20, 3, [6, 7, 7]),
        (20, 7, [2] + [3] * 6),
        (10, 4, [4, 2, 2, 2]),  # otherwise the remainder goes to the first task
        (200, 6, [35] + [33] * 5),
    ],
)
def test_equal_split_follows_cl_lite_split_task(c, n, expected):
    assert task_sizes(c, n) == expected


def test_every_equal_split_partitions_the_classes_with_equal_later_tasks():
    for c in range(1, 61):
        for n in range(1, c + 1):
            sizes = task_sizes(c, n)
            assert sum(sizes) == c and len(sizes) == n and min(sizes) >= 1 and len(set(sizes[1:])) <= 1, (c, n)


@pytest.mark.parametrize(
    ("n", "base", "match"),
    [
        (7, 50, "not divisible by 6"),
        (0, 0, "at least 1"),
        (101, 0, "at least one class"),
        (5, 120, "base_classes"),
        (1, 50, "single task"),
        (52, 50, "not divisible"),
        (2, 100, r"base_classes=100 takes all 100 classes, leaving none for the other 1 tasks; set base_classes below"),
    ],
)
def test_impossible_splits_are_rejected(n, base, match):
    with pytest.raises(SplitError, match=match):
        task_sizes(100, n, base)


def test_impossible_split_error_lists_valid_task_counts():
    with pytest.raises(SplitError, match=r"num_tasks can be one of \[2, 3, 6, 11, 26, 51\]"):
        task_sizes(100, 7, 50)


def test_split_partitions_classes_and_remaps_contiguously():
    split = ClassIncrementalSplit.build(100, num_tasks=11, base_classes=50, class_order_seed=1)
    flat = [c for task in split.tasks for c in task]
    assert flat == list(split.class_order) and sorted(flat) == list(range(100))
    assert split.offsets == (0, 50, 55, 60, 65, 70, 75, 80, 85, 90, 95, 100)
    lut = split.label_map(100)
    for t, classes in enumerate(split.tasks):  # task t owns labels [offsets[t], offsets[t+1])
        assert sorted(lut[classes].tolist()) == list(range(split.offsets[t], split.offsets[t + 1]))
    assert split.task_of_label().tolist()[:51] == [0] * 50 + [1]


def test_subset_and_explicit_order():
    split = ClassIncrementalSplit.build(100, num_tasks=4, class_order_seed=0, num_classes=20)
    assert split.class_order[:5] == (23, 8, 11, 7, 48) and split.task_sizes == (5, 5, 5, 5)
    lut = split.label_map(100)
    assert (lut >= 0).sum() == 20 and lut[23] == 0 and lut[0] == -1
    explicit = ClassIncrementalSplit.build(10, num_tasks=2, class_order=[3, 1, 2, 0])
    assert explicit.tasks == [[3, 1], [2, 0]]
    np.testing.assert_array_equal(explicit.label_map(10)[[3, 1, 2, 0]], [0, 1, 2, 3])


@pytest.mark.parametrize(
    ("order", "num_classes", "match"),
    [([1, 1, 2, 3], None, "more than once"), ([0, 1, 2, 10], None, "outside"), ([0, 1, 2], 5, "only 3 classes")],
)
def test_bad_explicit_orders(order, num_classes, match):
    with pytest.raises(SplitError, match=match):
        ClassIncrementalSplit.build(10, num_tasks=2, class_order=order, num_classes=num_classes)
