"""The C and Cython API (include/posenc_fast.h, posenc_fast/capi.pxd).

Two probe extensions (tests/capi/) are built here with setuptools, the way a
user builds one, once per session: capi_probe_c.c and its Cython twin.
Every call runs without the GIL; results must be bitwise those of the
Python API, and bad input must return its status having written nothing.
"""

import gc
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import posenc_fast as pf

sys.path.insert(0, str(Path(__file__).resolve().parent / "capi"))
import build as probe_build  # noqa: E402

HEADER = Path(pf.get_include()) / "posenc_fast.h"
ABI_VERSION = int(re.search(r"#define POSENC_FAST_ABI_VERSION (\d+)", HEADER.read_text())[1])
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPE = {np.dtype(np.float32): 1, np.dtype(np.float64): 2, np.dtype(np.float16): 3, BF16: 4}
HALF, INTERLEAVED, SPLIT = 1, 2, 3
(OK, ERR_NULL, ERR_DTYPE, ERR_SIZE, ERR_RANGE, ERR_ARGUMENT, ERR_OVERLAP, ERR_MEMORY,
 ERR_UNSUPPORTED) = range(9)


@pytest.fixture(scope="module", params=["capi_probe_c", "capi_probe_cy"])
def probe(request, tmp_path_factory):
    if not probe_build.have_compiler():
        pytest.skip("no C compiler")
    return probe_build.build(request.param, tmp_path_factory.mktemp(request.param))


def addr(a) -> int:
    return 0 if a is None else a.ctypes.data


def rows_of(x, out, positions, offset, seq_axis):
    """(dtype, x, out, outer, seq, inner, dim, positions, offset) for x's rows."""
    shape = x.shape
    axis = seq_axis % x.ndim
    outer = int(np.prod(shape[:axis]))
    inner = int(np.prod(shape[axis + 1:-1]))
    return (DTYPE[x.dtype], addr(x), addr(out), outer, shape[axis], inner, shape[-1],
            addr(positions), offset)


def sentinel(shape, dtype):
    return np.full(shape, -7.25, dtype=dtype)


shapes = st.tuples(st.integers(1, 3), st.integers(0, 9), st.integers(1, 3))
layouts = st.sampled_from(["half", "interleaved"])
dtypes = st.sampled_from([np.float32, np.float64, np.float16, BF16])


@given(shape=shapes, pairs=st.integers(1, 12), extra=st.integers(0, 3), start=st.integers(0, 3),
       layout=layouts, dtype=dtypes, offset=st.integers(0, 3000), explicit=st.booleans(),
       in_place=st.booleans(), inverse=st.booleans(), seq_axis=st.sampled_from([-2, -3]))
def test_rotate_rotary_equals_rotary_embedding_apply(probe, shape, pairs, extra, start, layout,
                                                    dtype, offset, explicit, in_place, inverse,
                                                    seq_axis):
    dim = start + 2 * pairs + extra
    rope = pf.RotaryEmbedding(dim, rotary_dim=2 * pairs, rotary_start=start, layout=layout)
    rng = np.random.default_rng(shape[1] * 31 + dim)
    x = rng.standard_normal(shape + (dim,)).astype(dtype)  # (outer, seq, inner, dim)
    positions = rng.integers(0, 500, shape[1]).astype(np.int64) if explicit else None
    axis = -3
    if seq_axis == -2:  # (outer, inner, seq, dim) with inner = 1
        x = x[:, :, :1].transpose(0, 2, 1, 3).copy()
        axis = -2
    want = rope.apply(x, None if positions is None else positions.reshape(-1, 1)
                      if axis == -3 else positions, offset=offset, seq_axis=axis, inverse=inverse)
    capsule = pf.rotary_table_capsule(rope, offset + 600, dtype=dtype)
    out = x if in_place else sentinel(x.shape, dtype)
    status = probe.rotate_rotary(capsule, *rows_of(x, out, positions, offset, axis), inverse)
    assert status == OK
    assert out.tobytes() == want.tobytes()


@given(shape=shapes, pairs=st.integers(1, 12), extra=st.integers(0, 3), layout=layouts,
       dtype=dtypes, table_dtype=dtypes, stride_extra=st.integers(0, 5), explicit=st.booleans(),
       in_place=st.booleans(), inverse=st.booleans())
def test_rotate_equals_apply_rotary_cos_sin(probe, shape, pairs, extra, layout, dtype,
                                            table_dtype, stride_extra, explicit, in_place,
                                            inverse):
    half_type_data = np.dtype(dtype) in (np.float16, BF16)
    # The kernels' pairs: float32/float64 data with either; half data with float32 or own.
    assume(np.dtype(table_dtype) in ((np.float32, dtype) if half_type_data else (np.float32, np.float64)))
    dim = 2 * pairs + extra
    rng = np.random.default_rng(shape[1] * 17 + dim)
    x = rng.standard_normal(shape + (dim,)).astype(dtype)  # (outer, seq, inner, dim)
    n = 40
    cos, sin = pf.RotaryEmbedding(2 * pairs).cos_sin(np.arange(n), dtype=table_dtype)
    # Both tables in one buffer with a row stride past npairs (vLLM keeps cos|sin rows).
    buffer = np.zeros((n, 2 * pairs + stride_extra), dtype=table_dtype)
    buffer[:, :pairs], buffer[:, pairs:2 * pairs] = cos, sin
    offset = 3
    positions = rng.integers(0, n - offset, shape[1]).astype(np.int64) if explicit else None
    table_rows = offset + (positions if explicit else np.arange(shape[1]))
    want = pf.apply_rotary_cos_sin(x, cos, sin, table_rows.reshape(1, -1, 1), layout=layout,
                                   inverse=inverse)
    out = x if in_place else sentinel(x.shape, dtype)
    status = probe.rotate(*rows_of(x, out, positions, offset, -3), DTYPE[np.dtype(table_dtype)],
                          addr(buffer), addr(buffer) + pairs * buffer.itemsize, n,
                          buffer.shape[1], pairs, HALF if layout == "half" else INTERLEAVED,
                          inverse)
    assert status == OK
    assert out.tobytes() == want.tobytes()


@given(n=st.integers(0, 1100), pairs=st.integers(1, 20), dtype=dtypes,
       fractional=st.booleans())
def test_fill_cos_sin_equals_cos_sin(probe, n, pairs, dtype, fractional):
    rope = pf.RotaryEmbedding(2 * pairs, scaling={"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 64})
    positions = np.arange(n, dtype=np.float64) * (0.37 if fractional else 1.0)
    want_cos, want_sin = rope.cos_sin(positions, dtype=dtype)
    freqs = rope.inv_freq_for(max(1, int(np.ceil(positions.max(initial=0))) + 1))
    cos, sin = sentinel((n, pairs), dtype), sentinel((n, pairs), dtype)
    status = probe.fill_cos_sin(DTYPE[np.dtype(dtype)], addr(cos), addr(sin), pairs,
                                addr(positions), n, addr(freqs), pairs, rope.attention_factor)
    assert status == OK
    assert cos.tobytes() == want_cos.tobytes() and sin.tobytes() == want_sin.tobytes()


@given(length=st.integers(0, 1100), dim=st.integers(1, 40), offset=st.integers(-50, 10**6),
       base=st.sampled_from([10000.0, 500.0, 1.5]),
       layout=st.sampled_from(["interleaved", "split"]), dtype=dtypes)
def test_fill_sinusoidal_equals_sinusoidal_table(probe, length, dim, offset, base, layout, dtype):
    want = pf.sinusoidal_table(length, dim, offset=offset, base=base, layout=layout, dtype=dtype)
    positions = offset + np.arange(length, dtype=np.float64)
    out = sentinel((length, dim), dtype)
    status = probe.fill_sinusoidal(DTYPE[np.dtype(dtype)], addr(out), addr(positions), length,
                                   dim, base, SPLIT if layout == "split" else INTERLEAVED)
    assert status == OK
    assert out.tobytes() == want.tobytes()


@given(shape=st.tuples(st.integers(1, 2), st.integers(1, 6), st.integers(0, 5),
                       st.integers(0, 40)),
       offset=st.integers(-20, 2**40), causal=st.booleans(), dtype=dtypes,
       in_place=st.booleans())
def test_add_alibi_equals_add_alibi(probe, shape, offset, causal, dtype, in_place):
    scores = np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)
    want = pf.add_alibi(scores, offset=offset, causal=causal)
    slopes = pf.alibi_slopes(shape[1])
    out = scores if in_place else sentinel(shape, dtype)
    status = probe.add_alibi(DTYPE[np.dtype(dtype)], addr(scores), addr(out), *shape,
                             addr(slopes), offset, causal)
    assert status == OK
    assert out.tobytes() == want.tobytes()


def test_calls_from_threads_without_the_gil_agree(probe):
    rope = pf.RotaryEmbedding(128, layout="half")
    x = np.random.default_rng(0).standard_normal((4, 256, 8, 128)).astype(np.float32)
    want = rope.apply(x, seq_axis=-3, offset=5)
    capsule = pf.rotary_table_capsule(rope, 300)

    def run(_):
        out = np.empty_like(x)
        assert probe.rotate_rotary(capsule, *rows_of(x, out, None, 5, -3), 0) == OK
        return out

    with ThreadPoolExecutor(4) as pool:
        for out in pool.map(run, range(8)):
            assert out.tobytes() == want.tobytes()


@pytest.mark.parametrize("rope", [pf.RotaryEmbedding.axial(16), pf.RotaryEmbedding(16, mrope_section=[2, 3, 3])])
def test_no_capsule_of_several_position_streams(rope):
    # rotate_rotary takes a position per row: every stream at it was a guess (apply refuses the axial one)
    with pytest.raises(ValueError, match=f"this embedding has {rope.n_streams} position streams"):
        pf.rotary_table_capsule(rope, 8)


def test_the_capsule_keeps_the_table_alive(probe):
    x = np.random.default_rng(1).standard_normal((1, 4, 2, 64)).astype(np.float64)
    want = pf.RotaryEmbedding(64).apply(x, offset=7, seq_axis=-3)
    rope = pf.RotaryEmbedding(64)
    capsule = pf.rotary_table_capsule(rope, 20, dtype=np.float64)
    del rope
    gc.collect()
    out = np.empty_like(x)
    assert probe.rotate_rotary(capsule, *rows_of(x, out, None, 7, -3), 0) == OK
    assert out.tobytes() == want.tobytes()


# Bad calls: (function, arguments by name over a valid call, status).
X = np.ones((2, 3, 2, 8), np.float32)
COS, SIN = pf.RotaryEmbedding(8).cos_sin(np.arange(10))
POSITIONS = np.array([0, 4, 9], np.int64)
BIG = 2**62


def rotate_call(target, **changes):
    call = dict(dtype=1, x=addr(X), out=addr(target), outer=2, seq=3, inner=2, dim=8,
                positions=addr(POSITIONS), offset=0, table_dtype=1, cos=addr(COS),
                sin=addr(SIN), rows=10, stride=4, npairs=4, layout=HALF, inverse=0)
    call.update(changes)
    return tuple(call.values())


ROTATE_ERRORS = [
    (dict(x=0), ERR_NULL), (dict(out=0), ERR_NULL), (dict(cos=0), ERR_NULL),
    (dict(sin=0), ERR_NULL), (dict(dtype=0), ERR_DTYPE), (dict(dtype=5), ERR_DTYPE),
    (dict(table_dtype=4), ERR_DTYPE), (dict(seq=-1), ERR_SIZE), (dict(dim=-8), ERR_SIZE),
    (dict(outer=BIG), ERR_SIZE), (dict(npairs=5), ERR_SIZE), (dict(npairs=0), ERR_SIZE),
    (dict(stride=3), ERR_SIZE), (dict(rows=-1), ERR_SIZE), (dict(rows=BIG, stride=BIG), ERR_SIZE),
    (dict(rows=9), ERR_RANGE), (dict(offset=1), ERR_RANGE), (dict(offset=-1), ERR_RANGE),
    (dict(positions=0, seq=3, offset=8), ERR_RANGE), (dict(offset=BIG), ERR_RANGE),
    (dict(layout=0), ERR_ARGUMENT), (dict(layout=SPLIT), ERR_ARGUMENT),
    (dict(inverse=2), ERR_ARGUMENT), (dict(x=addr(X) + 4), ERR_OVERLAP),
]


@pytest.mark.parametrize("changes, status", ROTATE_ERRORS)
def test_rotate_refuses_bad_input_and_writes_nothing(probe, changes, status):
    out = sentinel(X.shape, np.float32)
    before = out.copy()
    if "x" in changes:  # x overlapping out: x is out shifted by one element
        changes = {**changes, "x": addr(out) + 4} if changes["x"] else changes
    assert probe.rotate(*rotate_call(out, **changes)) == status
    assert out.tobytes() == before.tobytes()


def test_rotate_refuses_an_out_inside_the_table(probe):
    table = np.zeros((10, 8), np.float32)
    cos, sin = table[:, :4], table[:, 4:]
    call = rotate_call(table, cos=addr(cos), sin=addr(sin), stride=8, outer=1, seq=1, inner=1,
                       positions=0)
    assert probe.rotate(*call) == ERR_OVERLAP
    assert not table.any()


def test_rotate_takes_an_out_in_the_gaps_of_the_table(probe):
    # float32 rows [cos x4 | sin x4 | free x8]: one rotated row of 8 in row 0's free part
    rope = pf.RotaryEmbedding(8, layout="half")
    table = np.zeros((3, 16), np.float32)
    table[:, :4], table[:, 4:8] = rope.cos_sin(np.arange(3))
    x, out, positions = np.arange(1.0, 9.0, dtype=np.float32).reshape(1, 8), table[0, 8:], np.array([2], np.int64)
    call = rotate_call(out, x=addr(x), cos=addr(table), sin=addr(table) + 16, rows=3, stride=16, outer=1,
                       seq=1, inner=1, positions=addr(positions))
    assert probe.rotate(*call) == OK
    np.testing.assert_array_equal(out, rope.apply(x, positions)[0])


def test_rotate_refuses_an_out_over_the_positions(probe):
    # out (2*3*2 rows of 8 float32) begins at the positions' 3 int64: they would change mid-call.
    out = np.zeros(2 * 3 * 2 * 8, np.float32)
    positions = out[:6].view(np.int64)
    assert probe.rotate(*rotate_call(out, positions=addr(positions))) == ERR_OVERLAP
    assert not out.any()


def test_rotate_rotary_refuses_bad_input_and_writes_nothing(probe):
    rope = pf.RotaryEmbedding(8)
    capsule = pf.rotary_table_capsule(rope, 10)
    scaled = pf.rotary_table_capsule(pf.RotaryEmbedding(8, scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}), 4)
    out = sentinel(X.shape, np.float32)
    before = out.copy()

    def call(capsule=capsule, dtype=1, dim=8, positions=POSITIONS, offset=0, inverse=0, x=X, out=out):
        return probe.rotate_rotary(capsule, dtype, addr(x), addr(out), 2, 3, 2, dim,
                                   addr(positions), offset, inverse)

    assert call(capsule=None) == ERR_NULL
    assert call(x=None) == ERR_NULL
    # float64 data of the float32 table: x and out as large as the claimed dtype (a float32 out
    # claimed as float64 reaches past its end, over whatever lies there: ERR_OVERLAP at times)
    out64 = sentinel(X.shape, np.float64)
    assert call(dtype=2, x=X.astype(np.float64), out=out64) == ERR_DTYPE
    assert (out64 == -7.25).all()
    assert call(dtype=7) == ERR_DTYPE
    assert call(dim=6) == ERR_SIZE
    assert call(offset=1) == ERR_RANGE
    assert call(positions=np.array([0, -1, 2], np.int64)) == ERR_RANGE
    assert call(inverse=-1) == ERR_ARGUMENT
    assert call(capsule=scaled, positions=np.zeros(3, np.int64), inverse=1) == ERR_UNSUPPORTED
    assert out.tobytes() == before.tobytes()
    assert call(capsule=scaled, positions=np.zeros(3, np.int64)) == OK


def _elements(start, n, stride, width):
    return {start + r * stride + i for r in range(n) for i in range(width)}


@pytest.mark.parametrize("n, stride, width", [(1, 2, 2), (3, 4, 2), (4, 5, 2), (3, 7, 3)])
def test_fill_cos_sin_refuses_tables_that_share_an_element_only(probe, n, stride, width):
    # cos and sin at every pair of element offsets in one buffer: refused exactly where some cos
    # element is a sin element ([cos | sin] halves of one row are apart); what it writes is cos_sin's
    rope = pf.RotaryEmbedding(2 * width)
    freqs, positions = rope.inv_freq, np.arange(n, dtype=np.float64) + 3
    want_cos, want_sin = rope.cos_sin(positions)
    span = (n - 1) * stride + width
    for c in range(2 * span):
        for s in range(2 * span):
            both = sentinel(3 * span, np.float32)
            status = probe.fill_cos_sin(1, addr(both) + 4 * c, addr(both) + 4 * s, stride, addr(positions), n,
                                        addr(freqs), width, 1.0)
            if _elements(c, n, stride, width) & _elements(s, n, stride, width):
                assert status == ERR_OVERLAP and (both == -7.25).all(), (c, s)
            else:
                assert status == OK, (c, s)
                rows = np.arange(n)[:, None] * stride + np.arange(width)
                np.testing.assert_array_equal(both[c + rows], want_cos)
                np.testing.assert_array_equal(both[s + rows], want_sin)


def test_fill_cos_sin_takes_positions_in_the_gaps_of_its_table(probe):
    # float64 rows [cos cos | sin sin | free free]: positions in row 0's free pair, freqs in row 1's
    rope = pf.RotaryEmbedding(4)
    table = sentinel((2, 6), np.float64)
    positions, freqs = table[0, 4:], table[1, 4:]
    positions[:], freqs[:] = [1.0, 2.0], rope.inv_freq
    assert probe.fill_cos_sin(2, addr(table), addr(table) + 16, 6, addr(positions), 2, addr(freqs), 2, 1.0) == OK
    want_cos, want_sin = rope.cos_sin(np.array([1.0, 2.0]), dtype=np.float64)
    np.testing.assert_array_equal(table[:, :2], want_cos)
    np.testing.assert_array_equal(table[:, 2:4], want_sin)
    assert probe.fill_cos_sin(2, addr(table), addr(table) + 16, 6, addr(table) + 24, 2, addr(freqs), 2,
                              1.0) == ERR_OVERLAP  # positions over cos and sin of row 0
    assert probe.fill_cos_sin(2, addr(table), addr(table) + 16, 6, addr(positions), 2, addr(table) + 56, 2,
                              1.0) == ERR_OVERLAP  # freqs over cos of the last row


def test_tables_and_alibi_refuse_bad_input_and_write_nothing(probe):
    positions = np.arange(4, dtype=np.float64)
    freqs = np.array([1.0, 0.5])
    cos, sin = sentinel((4, 2), np.float32), sentinel((4, 2), np.float32)
    both = sentinel((4, 4), np.float32)

    def cos_sin(dtype=1, cos=cos, sin=sin, stride=2, positions=positions, n=4, npairs=2,
                scale=1.0):
        return probe.fill_cos_sin(dtype, addr(cos), addr(sin), stride, addr(positions), n,
                                  addr(freqs), npairs, scale)

    assert cos_sin(cos=None) == ERR_NULL
    assert cos_sin(positions=None) == ERR_NULL
    assert cos_sin(dtype=0) == ERR_DTYPE
    assert cos_sin(n=-1) == ERR_SIZE
    assert cos_sin(stride=1) == ERR_SIZE
    assert cos_sin(n=BIG) == ERR_SIZE
    assert cos_sin(sin=cos) == ERR_OVERLAP
    assert cos_sin(cos=both, sin=both[:, 1:], stride=4) == ERR_OVERLAP
    assert cos_sin(positions=np.array([0, np.nan, 1, 2])) == ERR_RANGE
    assert cos_sin(scale=np.inf) == ERR_RANGE
    assert (cos == -7.25).all() and (sin == -7.25).all() and (both == -7.25).all()

    out = sentinel((4, 6), np.float64)

    def sinusoidal(out=out, positions=positions, n=4, dim=6, base=10000.0, layout=INTERLEAVED):
        return probe.fill_sinusoidal(2, addr(out), addr(positions), n, dim, base, layout)

    assert sinusoidal(out=None) == ERR_NULL
    assert sinusoidal(dim=0) == ERR_SIZE
    assert sinusoidal(n=-2) == ERR_SIZE
    assert sinusoidal(layout=HALF) == ERR_ARGUMENT
    assert sinusoidal(base=0.0) == ERR_RANGE
    assert sinusoidal(base=np.nan) == ERR_RANGE
    assert sinusoidal(positions=np.array([0, np.inf, 1, 2])) == ERR_RANGE
    assert sinusoidal(positions=out.reshape(-1)[:4].view()) == ERR_OVERLAP
    assert (out == -7.25).all()

    scores = sentinel((1, 2, 3, 4), np.float32)
    slopes = pf.alibi_slopes(2)

    def alibi(scores=scores, batch=1, heads=2, offset=0, causal=1, slopes=slopes, out=scores):
        return probe.add_alibi(1, addr(scores), addr(out), batch, heads, 3, 4, addr(slopes),
                               offset, causal)

    assert alibi(slopes=None) == ERR_NULL
    assert alibi(heads=-1) == ERR_SIZE
    assert alibi(batch=BIG, heads=BIG) == ERR_SIZE
    assert alibi(causal=2) == ERR_ARGUMENT
    assert alibi(offset=2**52 + 1) == ERR_RANGE
    assert alibi(slopes=np.array([0.5, np.nan])) == ERR_RANGE
    shifted = sentinel((1, 2, 3, 5), np.float32)
    assert alibi(scores=shifted, out=shifted.reshape(-1)[1:]) == ERR_OVERLAP
    assert (scores == -7.25).all() and (shifted == -7.25).all()


def test_status_messages(probe):
    messages = [probe.status_message(code) for code in range(9)]
    assert messages[0] == "success" and len(set(messages)) == 9
    assert "pointer is NULL" in messages[ERR_NULL]
    assert probe.status_message(99) == "unknown posenc_fast status"


def test_an_abi_mismatch_is_refused_with_a_clear_message(probe):
    probe.import_version(ABI_VERSION)
    with pytest.raises(ImportError, match=f"compiled against ABI version {ABI_VERSION + 1}, the "
                                          f"installed posenc_fast provides version {ABI_VERSION}"):
        probe.import_version(ABI_VERSION + 1)


def test_rotary_table_capsule_validates_its_arguments():
    rope = pf.RotaryEmbedding(8)
    with pytest.raises(TypeError, match="rope must be a RotaryEmbedding"):
        pf.rotary_table_capsule("rope", 10)
    with pytest.raises(ValueError, match="num_positions must be >= 1"):
        pf.rotary_table_capsule(rope, 0)
    with pytest.raises(TypeError, match="dtype must be float16, bfloat16, float32 or float64"):
        pf.rotary_table_capsule(rope, 10, dtype=np.int32)
    with pytest.raises(ValueError, match="exceeds the 64 MiB"):
        pf.rotary_table_capsule(rope, 2**40)
    dynamic = pf.RotaryEmbedding(8, scaling={"rope_type": "dynamic", "factor": 2.0,
                                             "original_max_position_embeddings": 16})
    with pytest.raises(ValueError, match="num_positions must be <= 16"):
        pf.rotary_table_capsule(dynamic, 17)


def test_get_include_holds_the_header_and_the_cython_declarations():
    folder = Path(pf.get_include())
    assert (folder / "posenc_fast.h").is_file()
    assert (folder / "posenc_fast" / "capi.pxd").is_file()
    assert 'capsule object "posenc_fast._C_API"' in repr(pf._C_API)
