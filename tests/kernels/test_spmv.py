"""kernels/spmv.py: both forms against the NumPy reference and the dense product, on a matrix with empty rows,
a row longer than two warps and rows of one entry, in numba's CUDA simulator (CuPy on a GPU); the checks."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import spmv
from tests.kernels.conftest import DTYPE_IDS, DTYPES, host

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it

#: Stored values per row: empty rows (first, inside, last), one entry, a warp and more, more than two warps.
ROW_LENGTHS = [0, 3, 70, 1, 0, 33, 5, 0]
COLUMNS = 80


def csr(dtype, index=np.int32, seed: int = 0):
    """(indptr, indices, data, dense) with values depending on row and column, columns unsorted in some rows."""
    rng = np.random.default_rng(seed)
    dense = np.zeros((len(ROW_LENGTHS), COLUMNS))
    indices = []
    for i, length in enumerate(ROW_LENGTHS):
        cols = rng.choice(COLUMNS, size=length, replace=False)
        dense[i, cols] = rng.standard_normal(length) + i + cols / COLUMNS
        indices.append(cols)
    indptr = np.concatenate([[0], np.cumsum(ROW_LENGTHS)]).astype(index)
    cols = np.concatenate(indices).astype(index)
    rows = np.repeat(np.arange(len(ROW_LENGTHS)), ROW_LENGTHS)
    data = dense[rows, cols].astype(dtype)
    return indptr, cols, data, dense.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("form", spmv.FORMS)
def test_forms_equal_the_reference(simt, form, dtype):
    indptr, indices, data, dense = csr(dtype, np.int64 if dtype == np.float32 else np.int32)
    x = (np.linspace(-1, 2, COLUMNS) + np.arange(COLUMNS) % 7).astype(dtype)
    y = simt.full(len(ROW_LENGTHS), np.nan, dtype=dtype)  # every row must be written, empty ones as 0
    spmv.spmv(*(simt.asarray(a) for a in (indptr, indices, data, x)), y, form=form)
    want = np.empty(len(ROW_LENGTHS), dtype)
    spmv.spmv_numpy(indptr, indices, data, x, want)
    scale = np.abs(dense.astype(np.float64)) @ np.abs(x.astype(np.float64))
    tol = max(ROW_LENGTHS) * np.finfo(dtype).eps * scale
    assert np.all(np.abs(host(y) - want) <= tol), (host(y), want)
    assert np.all(np.abs(want - dense @ x) <= tol)
    assert host(y)[0] == 0 and host(y)[4] == 0 and host(y)[-1] == 0


def test_an_empty_matrix_writes_nothing():
    spmv.spmv(np.zeros(1, np.int32), np.zeros(0, np.int32), np.zeros(0), np.zeros(3), np.zeros(0))


def test_bytes_moved():
    # 10 rows, 40 values: 40·(8 + 8 + 4) for data, x and indices, 11·4 for indptr, 10·8 for y
    assert spmv.nbytes(10, 40, np.float64, np.int32) == 40 * 20 + 44 + 80


def _args(**change):
    indptr, indices, data, _ = csr(np.float64)
    args = dict(indptr=indptr, indices=indices, data=data, x=np.zeros(COLUMNS), y=np.zeros(len(ROW_LENGTHS)),
                form="warp")
    args.update(change)
    return args


@pytest.mark.parametrize("change, error, message", [
    (dict(form="vector"), ValueError, "form 'vector' is unknown; choose one of scalar, warp"),
    (dict(indptr=np.arange(9, dtype=np.int16)), ValueError, "indptr has dtype int16; it must be int32 or int64"),
    (dict(indices=np.zeros(112, np.int64)), ValueError, r"indices has dtype int64; it must be indptr's dtype \(int32\)"),
    (dict(y=np.zeros(7)), ValueError, "indptr has 9 entries and y 7; a CSR matrix of m rows has m \\+ 1 offsets"),
    (dict(data=np.zeros(111)), ValueError, "indices has 112 entries and data 111"),
    (dict(x=np.zeros(COLUMNS, np.float32)), ValueError, "data, x and y have dtypes float64, float32, float64"),
    (dict(x=np.zeros(50)), ValueError, r"column numbers run from \d+ to 7\d but x has 50 elements; every column must "
                                       r"lie in \[0, 50\)"),
    (dict(indptr=np.array([0, 3, 2, 75, 76, 76, 109, 114, 112], np.int32)), ValueError,
     "indptr must start at 0, never decrease and end at nnz = 112"),
    (dict(x=[0.0] * COLUMNS), TypeError, "x is a list"),
])
def test_bad_arguments_are_named(change, error, message):
    with pytest.raises(error, match=message):
        spmv.spmv(**_args(**change))


def test_output_must_not_alias_x():
    x = np.zeros(len(ROW_LENGTHS) + COLUMNS)
    with pytest.raises(ValueError, match="y shares memory with x or data"):
        spmv.spmv(**_args(x=x[:COLUMNS], y=x[COLUMNS - 1:COLUMNS - 1 + len(ROW_LENGTHS)]))
