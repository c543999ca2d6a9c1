"""add_position_table (learned absolute positions, GPT-2) against the reference."""

import ml_dtypes
import numpy as np
import pytest
from helpers import untouched
from hypothesis import given
from hypothesis import strategies as st

import posenc_fast as pf
from posenc_fast import reference

DTYPES = [np.float32, np.float64]


def random(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def wider(a, b):
    return np.promote_types(a, b)


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("table_dtype", DTYPES)
@pytest.mark.parametrize("in_place", [False, True])
def test_matches_reference_all_dtype_mixes(x_dtype, table_dtype, in_place):
    x = random((3, 7, 16), x_dtype, seed=1)
    table = random((20, 16), table_dtype, seed=2)
    original = x.copy()
    got = pf.add_position_table(x, table, offset=4, out=x if in_place else None)
    assert got.dtype == x_dtype and got.shape == (3, 7, 16)
    assert (got is x) == in_place
    # Formed in the wider dtype, rounded once to x's.
    work = wider(x_dtype, table_dtype)
    want = (original.astype(work) + table[4:11].astype(work)).astype(x_dtype)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, reference.add_position_table(original, table, offset=4),
                               rtol=1e-6 if x_dtype == np.float32 else 1e-15)


@pytest.mark.parametrize("x_shape, positions", [
    ((2, 5, 8), np.array([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]])),  # per sequence
    ((4, 1, 8), np.array([[3], [17], [0], [9]])),                    # a decode step
    ((4, 1, 8), np.array([5])),                                      # shared position
    ((5, 8), np.array([4, 4, 4, 0, 1])),                             # repeated rows
    ((2, 3, 4, 8), np.arange(4)),                                    # extra leading axes
    ((2, 3, 8), np.uint16(6)),                                       # scalar
])
def test_position_forms(x_shape, positions):
    x = random(x_shape, np.float32)
    table = random((30, 8), np.float32, seed=3)
    got = pf.add_position_table(x, table, positions, offset=1)
    np.testing.assert_allclose(got, reference.add_position_table(x, table, positions, offset=1),
                               rtol=1e-6)


def test_non_contiguous_x_table_and_out():
    base = random((4, 10, 32))
    x = base[:, ::2, ::2]
    table = random((40, 32), seed=4)[::2, ::2]
    want = reference.add_position_table(x, table)
    np.testing.assert_array_equal(pf.add_position_table(x, table), want)
    out = np.zeros((16, 5, 4)).T
    assert out.shape == x.shape
    assert pf.add_position_table(x, table, out=out) is out
    np.testing.assert_array_equal(out, want)
    before = base.copy()
    pf.add_position_table(x, table, out=x)
    np.testing.assert_array_equal(x, want)
    np.testing.assert_array_equal(base[:, 1::2], before[:, 1::2])


def test_table_is_read_without_copy_when_rows_are_strided():
    # A (max_len, dim) slice of a wider matrix keeps unit stride along dim.
    big = random((50, 64))
    table = big[:, :16]
    x = random((2, 6, 16))
    np.testing.assert_array_equal(pf.add_position_table(x, table),
                                  x + big[np.arange(6), :16])


@pytest.mark.parametrize("strided_table", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_runs_of_consecutive_rows(strided_table, in_place):
    # Rows reading consecutive table rows are added as one run; runs end at a
    # jump, a repeat, a step back and at the 256-row work items, and a table
    # whose rows do not follow each other in memory is read row by row.
    seq = 700
    positions = np.concatenate([np.arange(300), [5, 5, 6, 299, 298], np.arange(400, 795)])
    big = random((800, 40), np.float32, seed=5)
    table = big[:, 3:37] if strided_table else np.ascontiguousarray(big[:, 3:37])
    x = random((2, seq, 34), np.float32, seed=6)
    want = (x.astype(np.float64) + table[positions]).astype(np.float32)
    got = pf.add_position_table(x, table, positions, out=x if in_place else None)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rows, batch_rows", [
    (np.tile(np.arange(3, 10), 4), 7), (np.tile(np.arange(5), 2), 5), (np.arange(12), 0),  # one batch
    (np.concatenate([np.arange(4), np.arange(1, 5)]), 0),  # the second batch starts elsewhere
    (np.concatenate([np.arange(4), np.arange(3)]), 0),  # a batch short
    (np.concatenate([np.arange(4), [0, 1, 2, 2]]), 0), (np.array([2, 2, 2, 2]), 1),  # a repeat; batches of 1
    (np.zeros(0, np.intp), 0)])
def test_batches_at_the_same_positions_are_found(rows, batch_rows):
    from posenc_fast import _core

    assert _core.add_batch_rows(np.ascontiguousarray(rows, np.intp)) == batch_rows


@pytest.mark.parametrize("add_bytes", [1, 3 * 40 * 4, 1 << 30])  # turns of 1 and 3 table rows, of all
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("shape, positions, offset", [((5, 37, 40), None, 3), ((1, 37, 40), None, 0),
                                                      ((3, 37, 40), np.arange(36, -1, -1), 0),
                                                      ((2, 37, 40), np.stack([np.arange(37), np.r_[0, :36]]), 0),
                                                      ((4, 2, 37, 40), None, 1)])
def test_batches_in_turns_change_no_bit(add_bytes, in_place, dtype, shape, positions, offset):
    # add_position_table's batches at the same positions go in turns of `add` bytes of table rows
    # (_dispatch.block_bytes: by CPU), each batch a turn's rows in turn: the same bits as whole batches.
    from posenc_fast import _core

    x = random(shape, np.float32, seed=7).astype(dtype)
    table = random((50, 40), np.float32, seed=8)
    sizes = {kind: size for kind, (size, _) in _core.block_bytes().items()}
    got = {}
    for add in (0, add_bytes):
        before = _core.set_block_bytes(**dict(sizes, add=add))
        try:
            y = x.copy()
            got[add] = pf.add_position_table(y, table, positions, offset=offset, out=y if in_place else None)
        finally:
            _core.set_block_bytes(*before)
    assert got[add_bytes].tobytes() == got[0].tobytes()
    want = table[offset + (np.arange(37) if positions is None else positions)]
    np.testing.assert_allclose(got[0].astype(np.float64), x.astype(np.float64) + want, rtol=1e-2, atol=1e-2)


@given(batch=st.integers(0, 3), seq=st.integers(0, 9), dim=st.integers(0, 20),
       max_len=st.integers(14, 40), offset=st.integers(0, 5), double=st.booleans(),
       seed=st.integers(0, 2**16))
def test_random(batch, seq, dim, max_len, offset, double, seed):
    dtype = np.float64 if double else np.float32
    x = random((batch, seq, dim), dtype, seed)
    table = random((max_len, dim), np.float64, seed + 1)
    got = pf.add_position_table(x, table, offset=offset)
    np.testing.assert_array_equal(
        got, (x.astype(np.float64) + table[offset:offset + seq]).astype(dtype))


def test_out_of_range_positions_write_nothing():
    x = np.ones((2, 4, 8), np.float32)
    table = np.ones((10, 8), np.float32)
    for positions, offset, match in [
        (np.array([0, 1, 2, 10]), 0, r"\[0, max_len=10\), got largest 10"),
        (np.array([0, 1, 2, 3]), 7, r"got largest 10"),
        (np.array([-1, 0, 1, 2]), 0, "smallest -1"),
        (None, 7, "got largest 10"),
        (np.array([2**63 - 1, 0, 0, 0], dtype=np.uint64), 0, "largest 9223372036854775807"),
    ]:
        with pytest.raises(ValueError, match=match):
            pf.add_position_table(x, table, positions, offset=offset, out=x)
        assert (x == 1).all()


@pytest.mark.parametrize("call, error, match", [
    (dict(table=np.ones((10, 9))), ValueError, r"table must have shape \(max_len, 8\)"),
    (dict(table=np.ones(8)), ValueError, "table must have shape"),
    (dict(table=np.ones((10, 8), np.int32)), TypeError, "table must be a float16, bfloat16, float32 or float64"),
    (dict(positions=np.array([0.0, 1.0, 2.0])), TypeError, "positions must be an integer array"),
    (dict(positions=np.array([True, False, True])), TypeError, "integer array, got dtype bool"),
    (dict(positions=np.arange(4)), ValueError, "does not broadcast"),
    (dict(offset=1.5), TypeError, "offset must be an integer"),
    (dict(out=np.ones((2, 3, 8), np.float32)), ValueError, "out must have dtype float64"),
])
def test_bad_input_writes_nothing(call, error, match):
    x = np.ones((2, 3, 8))
    kwargs = dict(table=np.zeros((10, 8)), out=x)
    kwargs.update(call)
    out = kwargs["out"]
    out_before = out.copy()
    with pytest.raises(error, match=match):
        pf.add_position_table(x, **kwargs)
    assert (x == 1).all()
    assert untouched(out_before, out)


def test_out_overlapping_table_is_refused():
    table = np.zeros((10, 8))
    x = np.ones((1, 3, 8))
    with pytest.raises(ValueError, match="overlaps"):
        pf.add_position_table(x, table, out=table[:3].reshape(1, 3, 8))
    assert not table.any()
    with pytest.raises(TypeError, match="x must be a float16, bfloat16, float32 or float64"):
        pf.add_position_table(np.ones((1, 3, 8), np.int16), table)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        pf.add_position_table(np.ones(8), table)
