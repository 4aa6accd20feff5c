"""apps.sgd.data: the digits split, the teacher's per-index samples, and a sampler where N ranks equal one."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from apps.sgd import data

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


# ----------------------------------------------------------------------------- digits


@pytest.fixture(scope="module")
def digits():
    pytest.importorskip("sklearn")
    return data.load_digits()


def test_digits_shapes_dtypes_range(digits):
    assert digits.name == "digits" and digits.classes == 10 and digits.features == 64
    assert digits.x_train.shape == (data.DIGITS_SAMPLES - data.DIGITS_TEST, 64)
    assert digits.x_test.shape == (data.DIGITS_TEST, 64)
    assert digits.y_train.shape == (digits.x_train.shape[0],) and digits.y_test.shape == (data.DIGITS_TEST,)
    assert digits.x_train.dtype == np.float32 and digits.x_test.dtype == np.float32
    assert digits.y_train.dtype == np.int64 and digits.y_test.dtype == np.int64
    for x in (digits.x_train, digits.x_test):
        assert x.min() >= 0.0 and x.max() <= 1.0
    assert digits.x_train.max() == 1.0
    assert set(np.unique(digits.y_test)) == set(range(10))
    assert set(np.unique(digits.y_train)) == set(range(10))


def test_digits_dtype_honoured():
    pytest.importorskip("sklearn")
    d = data.load_digits(dtype=np.float64)
    assert d.x_train.dtype == np.float64 and d.x_test.dtype == np.float64
    with pytest.raises(data.DataError, match="not a floating-point type"):
        data.load_digits(dtype=np.int32)


def test_digits_split_deterministic_and_disjoint(digits):
    again = data.load_digits()
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert np.array_equal(getattr(digits, name), getattr(again, name))
    train, test = data.split_indices(data.DIGITS_SAMPLES, data.DIGITS_TEST, seed=0)
    assert len(train) + len(test) == data.DIGITS_SAMPLES
    assert len(np.intersect1d(train, test)) == 0
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(data.DIGITS_SAMPLES))
    # The arrays are exactly those rows of scikit-learn's data set, in that order.
    from sklearn import datasets

    raw = datasets.load_digits()
    assert np.array_equal(digits.y_test, raw.target[test])
    assert np.allclose(digits.x_train, raw.data[train] / 16.0)


def test_digits_without_scikit_learn(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # makes "from sklearn import ..." fail
    with pytest.raises(data.DataError, match=r"pip install -e '\.\[digits\]'"):
        data.load_digits()
    assert issubclass(data.DataError, ValueError)


# ----------------------------------------------------------------------------- teacher


def test_teacher_same_index_same_sample_whatever_the_request():
    teacher = data.Teacher(seed=3)
    x_all, y_all = teacher.samples(np.arange(2500))
    x5, y5 = teacher.samples(np.array([5]))
    assert np.array_equal(x5[0], x_all[5]) and y5[0] == y_all[5]
    # Scattered, unsorted, repeated, across block boundaries, and from a fresh instance.
    picks = np.array([2047, 3, 1024, 2499, 1023, 3, 0, 2048])
    x, y = data.Teacher(seed=3).samples(picks)
    assert np.array_equal(x, x_all[picks]) and np.array_equal(y, y_all[picks])
    # A far index does not need the blocks before it, and is stable too.
    far = np.array([10_000_000, 10_000_001])
    assert np.array_equal(teacher.samples(far)[0], teacher.samples(far[::-1])[0][::-1])


def test_teacher_labels_are_the_networks_argmax():
    teacher = data.Teacher(features=16, classes=5, hidden=32, seed=1)
    x, y = teacher.samples(np.arange(3000), dtype=np.float64)
    assert np.array_equal(y, np.argmax(teacher.logits(x), axis=1))


def test_teacher_seeds_differ_and_classes_covered():
    a = data.Teacher(seed=0).samples(np.arange(2000))
    b = data.Teacher(seed=1).samples(np.arange(2000))
    assert not np.array_equal(a[0], b[0]) and not np.array_equal(a[1], b[1])
    counts = np.bincount(a[1], minlength=10)
    assert (counts > 0).sum() >= 8 and counts.max() < 0.5 * counts.sum()


def test_teacher_noise_changes_some_labels_not_inputs():
    clean = data.Teacher(seed=2).samples(np.arange(3000))
    noisy = data.Teacher(seed=2, noise=1.0).samples(np.arange(3000))
    assert np.array_equal(clean[0], noisy[0])
    changed = np.mean(clean[1] != noisy[1])
    assert 0.0 < changed < 0.9


def test_teacher_dtype_shapes_and_errors():
    teacher = data.Teacher(features=7, classes=3, hidden=5)
    for dtype in (np.float32, np.float64):
        x, y = teacher.samples(np.arange(10), dtype=dtype)
        assert x.dtype == dtype and x.shape == (10, 7) and y.dtype == np.int64 and y.shape == (10,)
        assert set(np.unique(y)) <= {0, 1, 2}
    x, y = teacher.samples(np.array([], dtype=np.int64))
    assert x.shape == (0, 7) and y.shape == (0,)
    with pytest.raises(data.DataError, match="negative"):
        teacher.samples(np.array([0, -1]))
    with pytest.raises(data.DataError, match="one-dimensional"):
        teacher.samples(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(data.DataError, match="classes=1"):
        data.Teacher(classes=1)


def test_teacher_dataset():
    d = data.teacher_dataset(300, 100, features=12, classes=4, hidden=8, seed=5, dtype=np.float64)
    assert d.name == "teacher" and d.classes == 4 and d.features == 12
    assert d.x_train.shape == (300, 12) and d.x_test.shape == (100, 12) and d.x_train.dtype == np.float64
    x, y = data.Teacher(features=12, classes=4, hidden=8, seed=5).samples(np.arange(300, 400), dtype=np.float64)
    assert np.array_equal(d.x_test, x) and np.array_equal(d.y_test, y)


# ----------------------------------------------------------------------------- the sampler


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n,batch", [(103, 10), (50, 7), (20, 5), (9, 4)])
def test_ranks_together_equal_one_rank(world, n, batch):
    if batch < world:
        pytest.skip("batch smaller than the ranks")
    single = data.Sampler(n, batch, 1, 0, seed=11)
    ranks = [data.Sampler(n, batch, world, r, seed=11) for r in range(world)]
    assert all(s.steps_per_epoch == single.steps_per_epoch == -(-n // batch) for s in ranks)
    for epoch in (0, 1):
        seen = []
        for step in range(single.steps_per_epoch):
            whole, count = single.batch(epoch, step)
            parts = [s.batch(epoch, step) for s in ranks]
            assert all(c == count == len(whole) for _, c in parts)
            assert np.array_equal(np.concatenate([p for p, _ in parts]), whole)
            assert max(len(p) for p, _ in parts) - min(len(p) for p, _ in parts) <= 1
            seen.append(whole)
        # Every sample exactly once per epoch, across steps and ranks.
        assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(n))
        assert np.array_equal(np.concatenate(seen), single.order(epoch))


def test_uneven_last_batch_and_empty_ranks():
    # 10 samples, batch 8, 4 ranks: the last batch has 2 samples, so ranks 2 and 3 get none.
    samplers = [data.Sampler(10, 8, 4, r, seed=0) for r in range(4)]
    assert samplers[0].steps_per_epoch == 2
    last = [s.batch(0, 1) for s in samplers]
    assert [len(idx) for idx, _ in last] == [1, 1, 0, 0]
    assert all(count == 2 for _, count in last)
    assert last[2][0].dtype == last[0][0].dtype
    first = [s.batch(0, 0) for s in samplers]
    assert [len(idx) for idx, _ in first] == [2, 2, 2, 2] and first[0][1] == 8


def test_epochs_reshuffle_but_agree_across_ranks():
    a = data.Sampler(100, 10, 4, 0, seed=3)
    b = data.Sampler(100, 10, 4, 3, seed=3)
    assert np.array_equal(a.order(0), b.order(0)) and np.array_equal(a.order(1), b.order(1))
    assert not np.array_equal(a.order(0), a.order(1))
    assert np.array_equal(a.order(0), np.random.default_rng([3, 0]).permutation(100))
    assert np.array_equal(np.sort(a.order(5)), np.arange(100))
    assert not np.array_equal(a.order(0), data.Sampler(100, 10, 4, 0, seed=4).order(0))
    # Asking for epochs out of order gives the same answers (nothing depends on call history).
    again = data.Sampler(100, 10, 4, 0, seed=3)
    assert np.array_equal(again.batch(1, 2)[0], a.batch(1, 2)[0])
    assert np.array_equal(again.batch(0, 2)[0], a.batch(0, 2)[0])
    # The returned arrays are copies: mutating one does not change the sampler.
    order = a.order(0)
    order[:] = 0
    assert np.array_equal(np.sort(a.order(0)), np.arange(100))


def test_no_shuffle_is_identity():
    s = data.Sampler(10, 4, 2, 1, shuffle=False)
    assert np.array_equal(s.order(0), np.arange(10)) and np.array_equal(s.order(7), np.arange(10))
    assert [idx.tolist() for _, idx, _ in s.batches(0)] == [[2, 3], [6, 7], [9]]


def test_batches_resume_exactly():
    s = data.Sampler(57, 8, 3, 1, seed=9)
    full = list(s.batches(2))
    assert [step for step, _, _ in full] == list(range(s.steps_per_epoch)) == list(range(8))
    for k in range(s.steps_per_epoch + 1):
        resumed = list(data.Sampler(57, 8, 3, 1, seed=9).batches(2, start=k))
        assert len(resumed) == len(full) - k
        for (s1, i1, c1), (s2, i2, c2) in zip(resumed, full[k:]):
            assert s1 == s2 and c1 == c2 and np.array_equal(i1, i2)
    assert full[-1][2] == 57 - 7 * 8
    with pytest.raises(ValueError, match="start step 9 is out of range"):
        s.batches(2, start=9)


def test_drop_last():
    s = data.Sampler(103, 10, 3, 0, drop_last=True)
    assert s.steps_per_epoch == 10 and len(s) == 10
    assert all(count == 10 for _, _, count in s.batches(0))
    with pytest.raises(ValueError, match="step 10 is out of range"):
        s.batch(0, 10)
    assert data.Sampler(100, 10, 3, 0, drop_last=True).steps_per_epoch == 10
    assert data.Sampler(103, 10, 3, 0).steps_per_epoch == 11
    with pytest.raises(ValueError, match="no full batch of 10"):
        data.Sampler(5, 10, 1, 0, drop_last=True)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(n=0, global_batch=4, world_size=1, rank=0), "has 0 samples"),
        (
            dict(n=100, global_batch=2, world_size=4, rank=0),
            r"global batch 2 is smaller than the 4 ranks: every rank needs at least one sample; use --batch >= 4",
        ),
        (dict(n=100, global_batch=0, world_size=1, rank=0), "global batch 0 is invalid"),
        (dict(n=100, global_batch=8, world_size=4, rank=4), r"rank 4 is out of range for 4 ranks"),
        (dict(n=100, global_batch=8, world_size=4, rank=-1), r"rank -1 is out of range"),
        (dict(n=100, global_batch=8, world_size=0, rank=0), "world size 0 is invalid"),
    ],
)
def test_sampler_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        data.Sampler(**kwargs)


def test_sampler_bad_epoch_and_step():
    s = data.Sampler(20, 5, 2, 0)
    with pytest.raises(ValueError, match="epoch -1 is invalid"):
        s.order(-1)
    with pytest.raises(ValueError, match="step 4 is out of range: an epoch has 4 steps"):
        s.batch(0, 4)
