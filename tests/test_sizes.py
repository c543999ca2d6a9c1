"""Large positions, offsets and sizes: index arithmetic must not overflow.

CI-sized tests cover the index paths with large values: positions and
offsets near 2**31, 2**32, 2**53, 2**61 (the RoPE fast path's bound) and
2**63, the edge of the RoPE cos/sin cache, ALiBi rows of 2**21 keys and
offsets near 2**52.  Arrays with more than 2**31 elements need 8 GiB or
more: those tests are marked ``slow`` and run only with
``POSENC_FAST_TEST_BIG=1`` (see the development section of README.md).
"""

import gc
import math
import os

import numpy as np
import pytest

import posenc_fast as pf
from posenc_fast import reference as ref

from helpers import angle_atol, exact_cos_sin

BIG = os.environ.get("POSENC_FAST_TEST_BIG", "") not in ("", "0")
big = pytest.mark.skipif(not BIG, reason="needs ~9 GiB of memory: set POSENC_FAST_TEST_BIG=1")

EPS32 = float(np.finfo(np.float32).eps)


def _pairs(n_rows, npairs, dtype):
    """x with every pair (1, 0): its rotation by theta is (cos theta, sin theta)."""
    x = np.zeros((n_rows, 2 * npairs), dtype=dtype)
    x[:, 0::2] = 1
    return x


@pytest.mark.parametrize("position", [2**31 - 1, 2**31, 2**31 + 1, 2**32 - 1, 2**32, 2**32 + 7,
                                      2**40 + 3, 2**52 - 1, 2**52, 2**53 - 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rope_at_large_integer_positions_matches_exact_values(position, dtype):
    rope = pf.RotaryEmbedding(8)
    x = _pairs(3, 4, dtype)
    positions = np.array([position - 1, position, position + 1], dtype=np.int64)
    got = rope.apply(x, positions)
    as_float = rope.apply(x, positions.astype(np.float64))
    with_offset = rope.apply(x, offset=position - 1)  # positions None: offset + arange(3)
    assert got.tobytes() == as_float.tobytes() == with_offset.tobytes()
    for r, p in enumerate(positions):
        for i, w in enumerate(rope.inv_freq):
            c, s = exact_cos_sin(float(p), float(w))
            tol = 0.6 * np.spacing(dtype(1)) + 64 * 2.0**-52
            assert abs(got[r, 2 * i] - c) <= tol and abs(got[r, 2 * i + 1] - s) <= tol


@pytest.mark.parametrize("offset", [2**61 - 3, 2**61, -(2**61) + 1, -(2**61), 2**62, 2**63 - 1,
                                    -(2**63), 2**64, 10**20])
def test_rope_offsets_around_the_fast_path_bound(offset):
    # The compiled fast path works in long long for |offset| < 2**61 and hands
    # larger values to the general path; both must give sane rotations.
    rope = pf.RotaryEmbedding(4)
    x = _pairs(5, 2, np.float64)
    positions = np.arange(5, dtype=np.int64)
    got = rope.apply(x, positions, offset=offset)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got[:, 0::2] ** 2 + got[:, 1::2] ** 2, 1.0, rtol=1e-14)
    # Same as the float position the general path forms.
    want = rope.apply(x, positions.astype(np.float64) + float(offset))
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("value", [2**61 - 1, 2**61, 2**62, 2**63 - 1, -(2**63)])
def test_rope_int64_positions_at_the_extremes(value):
    rope = pf.RotaryEmbedding(4)
    x = _pairs(3, 2, np.float32)
    positions = np.array([value, 0, value], dtype=np.int64)
    got = rope.apply(x, positions)
    want = rope.apply(x, positions.astype(np.float64))
    assert got.tobytes() == want.tobytes()
    assert np.abs(got).max() <= 1.0


def _cache_rows(npairs, itemsize):
    # RotaryBase's per-dtype cos/sin cache holds at most 64 MiB.
    return (64 * 1024 * 1024) // (2 * itemsize * npairs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rope_at_the_edge_of_the_cos_sin_table(dtype):
    # Positions just below the cache limit take the fast path; just above, the
    # general path.  Both give the same bits.
    rope = pf.RotaryEmbedding(2)
    limit = _cache_rows(1, np.dtype(dtype).itemsize)
    x = _pairs(8, 1, dtype)
    for start in (limit - 9, limit - 4, limit, limit + 5):
        fast = rope.apply(x, offset=start)
        general = rope.apply(x, offset=float(start))
        assert fast.tobytes() == general.tobytes()
        for r in range(8):
            c, s = exact_cos_sin(float(start + r), 1.0)
            assert abs(fast[r, 0] - c) <= 2 * np.spacing(dtype(1)) + 1e-14


def test_sinusoidal_table_at_large_offsets():
    for offset in (2**31 - 3, 2**32 - 3, 2**52 - 3000):
        table = pf.sinusoidal_table(2000, 8, offset=offset, dtype=np.float64)
        for r in (0, 1, 1023, 1024, 1999):
            want = ref.sinusoidal_row(offset + r, 8)
            np.testing.assert_allclose(table[r], want, rtol=0,
                                       atol=4 * 2.0**-52 * (offset + r) + 1e-13)


def test_alibi_with_two_million_keys_and_large_offsets():
    k_len = 2**21 + 3
    for offset in (0, 2**31, 2**52 - k_len):
        bias = pf.alibi_bias(3, 2, k_len, offset=offset, dtype=np.float64)
        slopes = pf.alibi_slopes(3)
        j = np.array([0, 1, 2**20, 2**21, k_len - 1], dtype=np.float64)
        for h in range(3):
            for i in range(2):
                want = slopes[h] * (j - (offset + i))
                np.testing.assert_array_equal(bias[h, i, j.astype(np.intp)], want)
        scores = np.zeros((1, 3, 2, k_len), np.float32)
        pf.add_alibi(scores, offset=offset, out=scores)
        np.testing.assert_array_equal(scores[0], bias.astype(np.float32))
        del bias, scores
        gc.collect()


@pytest.mark.parametrize("offset", [2**52, -(2**52), 2**31])
def test_relative_indices_with_large_offsets_and_many_keys(offset):
    k_len = 2**20 + 5
    q_len = 3
    idx = pf.relative_position_index(q_len, k_len, max_distance=2**51, offset=offset)
    j = np.arange(k_len, dtype=np.int64)
    for i in range(q_len):
        want = np.clip(j - (offset + i), -(2**51), 2**51) + 2**51
        np.testing.assert_array_equal(idx[i], want)
    buckets = pf.t5_relative_bucket(q_len, k_len, offset=offset, num_buckets=2**20,
                                    max_distance=2**40)
    cols = [0, 1, 2**19, k_len - 1]
    for i in range(q_len):
        for col in cols:
            assert buckets[i, col] == ref.t5_bucket(col - (offset + i), True, 2**20, 2**40)


def test_add_position_table_with_a_16m_row_table():
    max_len = 2**24 + 3
    table = np.arange(max_len, dtype=np.float32).reshape(max_len, 1)
    x = np.zeros((2, 4, 1), np.float32)
    positions = np.array([[0, 2**24 - 1, 2**24, 2**24 + 2]] * 2, dtype=np.uint64)
    got = pf.add_position_table(x, table, positions)
    np.testing.assert_array_equal(got[..., 0], positions.astype(np.float32))


# Rotations of results past 512 KiB prefetch each row's successors, and past
# 16 MiB write with non-temporal stores (in place, rows of 256 bytes or less
# go a head's block of positions in one call): bits as from calls on small pieces.
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("positions", ["arange", "float"])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("dim", [128, 64])
def test_rope_past_the_cache_size_thresholds_matches_small_calls(dtype, layout, positions,
                                                                 in_place, dim):
    rope = pf.RotaryEmbedding(dim, layout=layout)
    seq = (17 * 2**20) // (4 * dim * np.dtype(dtype).itemsize) + 3  # 17 MiB over 4 heads
    x = np.random.default_rng(5).standard_normal((1, 4, seq, dim)).astype(dtype)
    # Integer positions take the compiled fast path, float ones the general path.
    pos = np.arange(seq) + 11 if positions == "arange" else np.arange(seq) + 11.0
    want = np.empty_like(x)
    for start in range(0, seq, 64):  # pieces of at most 256 KiB: neither path
        stop = min(seq, start + 64)
        want[:, :, start:stop] = rope.apply(np.ascontiguousarray(x[:, :, start:stop]),
                                            pos[start:stop])
    x0 = x.copy()
    got = rope.apply(x, pos, out=x if in_place else None)
    assert got is x if in_place else got is not x
    assert got.tobytes() == want.tobytes()
    for row in (0, seq // 2, seq - 1):
        expected = ref.rotate_vector(x0[0, 3, row].tolist(), float(pos[row]),
                                     rope.inv_freq.tolist(), layout)
        atol = 1e-6 if dtype == np.float32 else 4 * angle_atol(seq + 11)
        np.testing.assert_allclose(got[0, 3, row], expected, rtol=0, atol=atol)


# (position, row, group, group_interleaved, scalar_in_place, add, stream) block bytes: blocks of 16
# positions and of 1, a head at a time; Zen 4's 4 MiB, 8 KiB, 768 and 2048 bytes; every row in groups
# of heads, with blocks of 16 positions and of 1; one layout in groups, the other not; the in-place
# rows past the caches by the scalar kernel or by the vectors; every result out of place streamed, or
# none; half-type rows by whole lines or not (add: add_position_table's, not these walks')
@pytest.mark.parametrize("block_bytes", [(1, 1, 0, 0, 512, 0, 16 << 20, 0),
                                         (4 << 20, 8 << 10, 768, 2048, 512, 0, 16 << 20, 1),
                                         (1, 1, 1 << 20, 1 << 20, 0, 0, 16 << 20, 0),
                                         (4 << 20, 8 << 10, 1 << 20, 1 << 20, 2048, 0, 16 << 20, 1),
                                         (1, 1, 1 << 20, 0, 1 << 30, 0, 16 << 20, 1),
                                         (1, 1, 0, 1 << 20, 0, 0, 16 << 20, 0),
                                         (512 << 10, 16 << 10, 0, 0, 512, 0, 1, 1),
                                         (512 << 10, 16 << 10, 0, 0, 512, 0, 1 << 40, 1)])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("dim", [128, 64])
@pytest.mark.parametrize("seq_bytes", [17 * 2**20, 2**20])  # past the caches, in them
@pytest.mark.parametrize("ordered", [True, False])  # positions in order, or a position array
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_the_walks_block_sizes_change_no_bit(block_bytes, in_place, dim, seq_bytes, ordered, layout):
    # _dispatch sets the walks' block sizes for the CPU (a speed matter only); 7 heads: groups of 4 and 3
    from posenc_fast import _core

    rope = pf.RotaryEmbedding(dim, layout=layout)
    seq = seq_bytes // (28 * dim) + 5
    x = np.random.default_rng(6).standard_normal((1, 7, seq, dim)).astype(np.float32)
    positions = None if ordered else np.random.default_rng(7).permutation(seq)
    want = rope.apply(x, positions)
    before = _core.set_block_bytes(*block_bytes)
    try:
        got = rope.apply(x, positions, out=x if in_place else None)
    finally:
        _core.set_block_bytes(*before)
    assert got.tobytes() == want.tobytes()


def test_the_stream_size_decides_which_results_are_streamed():
    # block_bytes()["stream"] (by CPU): out-of-place results at least this large are written with
    # non-temporal stores and their rows walked past the caches (no bit changes: the test above)
    from posenc_fast import _core

    sizes = {kind: size for kind, (size, _) in _core.block_bytes().items()}
    before = _core.set_block_bytes(**dict(sizes, stream=64 << 20))
    try:
        assert not _core.streams(32 << 20) and _core.streams(64 << 20)
        _core.set_block_bytes(**dict(sizes, stream=1 << 20))
        assert _core.streams(1 << 20) and not _core.streams((1 << 20) - 1)
        with pytest.raises(ValueError, match="position, row and stream must be >= 1"):
            _core.set_block_bytes(**dict(sizes, stream=0))
        assert _core.block_bytes()["stream"][0] == 1 << 20  # nothing set by the refused call
    finally:
        _core.set_block_bytes(*before)


def _guarded(nbytes, offset):
    # nbytes `offset` bytes past a 64-byte line, inside a buffer of 0xAB bytes: (buffer, start)
    raw = np.full(nbytes + 256, 0xAB, np.uint8)
    start = (-raw.ctypes.data) % 64 + 64 + offset
    return raw, start


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("dim", [64, 128, 192, 256, 96])  # 96: 48 pairs, not whole packs
@pytest.mark.parametrize("offset", [16, 32, 48, 0, 2])  # off a line (NumPy's: 16), on one, off a word
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("inverse", [False, True])
def test_half_rows_written_by_whole_lines_change_no_bit_and_no_neighbour(dtype, dim, offset, threads, inverse):
    # block_bytes()["lines"] (by CPU): out-of-place float16 / bfloat16 results of at least this size
    # (not streamed) whose rows start off a 64-byte line go by whole-line stores, the first and last
    # line of each block of rows by masked stores of its own bytes (AVX-512 variants): the bits of
    # the split stores, and not one byte outside `out`, whichever thread writes a neighbouring block
    import ml_dtypes

    from posenc_fast import _core

    dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    rope = pf.RotaryEmbedding(dim, layout="half")
    x = np.random.default_rng(8).standard_normal((1, 7, 300, dim)).astype(dtype)  # 2 threads: >= 131072 elements
    sizes = {kind: size for kind, (size, _) in _core.block_bytes().items()}
    raw, start = _guarded(x.nbytes, offset)
    out = raw[start:start + x.nbytes].view(dtype).reshape(x.shape)
    threads_before = pf.get_num_threads()
    before = _core.set_block_bytes(**dict(sizes, lines=0))
    try:
        pf.set_num_threads(threads)
        assert not _core.writes_lines(x.nbytes)
        want = rope.apply(x, inverse=inverse).view(np.uint16)  # each pack by a (split) 64-byte store
        _core.set_block_bytes(**dict(sizes, lines=1, stream=1 << 40))
        assert _core.writes_lines(x.nbytes)
        rope.apply(x, inverse=inverse, out=out)
    finally:
        _core.set_block_bytes(*before)
        pf.set_num_threads(threads_before)
    assert np.array_equal(out.view(np.uint16), want)
    assert (raw[:start] == 0xAB).all() and (raw[start + x.nbytes:] == 0xAB).all()


def test_the_line_size_decides_which_half_results_go_by_lines():
    from posenc_fast import _core

    sizes = {kind: size for kind, (size, _) in _core.block_bytes().items()}
    before = _core.set_block_bytes(**dict(sizes, lines=2 << 20, stream=48 << 20))
    try:
        assert _core.writes_lines(2 << 20) and not _core.writes_lines((2 << 20) - 1)
        assert not _core.writes_lines(48 << 20)  # streamed instead
        _core.set_block_bytes(**dict(sizes, lines=0))
        assert not _core.writes_lines(1 << 30)  # never
        with pytest.raises(ValueError, match="add and lines >= 0"):
            _core.set_block_bytes(**dict(sizes, lines=-1))
        assert _core.block_bytes()["lines"][0] == 0  # nothing set by the refused call
    finally:
        _core.set_block_bytes(*before)


# ---------------------------------------------------------------------------
# more than 2**31 elements (memory permitting)


@big
@pytest.mark.slow
def test_rope_in_place_on_more_than_2_31_elements():
    # (2**24 + 1) * 64 rows of 2 float32: 2**31 + 128 elements, 8 GiB.  The
    # fast path rotates in place with flattened indices beyond 2**31.
    rope = pf.RotaryEmbedding(2)
    batch, seq = 2**24 + 1, 64
    x = np.empty((batch, seq, 2), np.float32)
    assert x.size > 2**31
    chunk = 2**18
    for b in range(0, batch, chunk):
        x[b:b + chunk, :, 0] = 1
        x[b:b + chunk, :, 1] = 0
    result = rope.apply(x, out=x, offset=1000)
    assert result is x
    expected = rope.apply(_pairs(seq, 1, np.float32)[None], offset=1000)[0]
    for b in range(0, batch, chunk):
        assert np.array_equal(x[b:b + chunk], np.broadcast_to(expected, x[b:b + chunk].shape))
    del x, result
    gc.collect()


@big
@pytest.mark.slow
def test_add_alibi_in_place_on_more_than_2_31_elements():
    # (2**16 + 1) * 2**15 float32 scores, 8 GiB, in place.
    q_len, k_len = 2**16 + 1, 2**15
    scores = np.zeros((1, 1, q_len, k_len), np.float32)
    assert scores.size > 2**31
    pf.add_alibi(scores, out=scores, offset=7)
    for i in (0, 1, 2**15, 2**16 - 1, q_len - 1):
        want = (np.arange(k_len, dtype=np.float64) - (7 + i)) * pf.alibi_slopes(1)[0]
        np.testing.assert_array_equal(scores[0, 0, i], want.astype(np.float32))
    del scores
    gc.collect()


def test_isa_variants_agree_bitwise_at_huge_angles():
    # The large-angle branch of the exact cos/sin (angles past 2**26) and the
    # clamped T5 bucket, compiled once per ISA variant, give the same bits.
    import subprocess
    import sys

    code = ("import numpy as np, posenc_fast as pf, sys\n"
            "p = np.array([2.0**62, 3 * 2.0**55 + 1024, 1e17 + 64, 2.0**30 + 0.5, 1e300])\n"
            "a = pf.sinusoidal(p[:4], 33, dtype=np.float64)\n"
            "b = pf.sinusoidal(p, 7, base=1e300, dtype=np.float64)\n"
            "c, s = pf.RotaryEmbedding(64).cos_sin(p[:4], dtype=np.float64)\n"
            "t = pf.t5_relative_bucket(2, 3, offset=2**51, num_buckets=2**52, "
            "max_distance=2**50 + 1)\n"
            "sys.stdout.buffer.write(a.tobytes() + b.tobytes() + c.tobytes() + s.tobytes()"
            " + t.tobytes())\n")
    info = pf.build_info()
    outputs = {}
    for variant in info["isa_built"]:
        if variant in info["isa_supported"]:
            result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                    timeout=120, env={**os.environ, "POSENC_FAST_ISA": variant})
            assert result.returncode == 0, result.stderr
            outputs[variant] = result.stdout
    assert len(set(outputs.values())) == 1, f"variants differ: {list(outputs)}"
    values = np.frombuffer(next(iter(outputs.values()))[:-6 * 8], dtype=np.float64)
    assert np.abs(values).max() <= 1.0


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dim", [80, 100])
def test_streamed_rows_of_every_head_size_equal_in_place_rows(dtype, layout, dim):
    # Out of place past POSENC_STREAM_BYTES (16 MiB) the rows go to memory by
    # non-temporal stores where they lie on 16-byte boundaries, assembled in
    # a row buffer where the vector registers do not take a whole row (head_dim
    # 100: half rows 8 bytes off a boundary; 80: pairs left over), plain stores
    # elsewhere; in place never streams.  Bitwise the same, aligned out or not.
    import ml_dtypes

    dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    rope = pf.RotaryEmbedding(dim, layout=layout)
    seq = (16 << 20) // (8 * dim * dtype.itemsize) + 7
    x = np.random.default_rng(dim).standard_normal((1, 8, seq, dim)).astype(dtype)
    want = x.copy()
    rope.apply(want, offset=3, out=want)
    for out in (None, np.empty(x.size + 1, dtype)[1:].reshape(x.shape)):
        got = rope.apply(x, offset=3, out=out)
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("scalar_in_place", [0, 1 << 30])  # every row by the scalar kernel, none
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dim", [24, 80, 100, 128])
def test_in_place_rows_past_the_caches_at_every_alignment(dtype, dim, scalar_in_place):
    # In place past POSENC_STREAM_BYTES, half-layout rows shorter than
    # block_bytes()["scalar_in_place"] go by unaligned vectors, the pairs past
    # the last whole vector by one overlapping vector loaded before any store;
    # longer rows by the scalar kernel, from a scalar head to the vector
    # alignment (24: fewer pairs than an AVX-512 vector of float32).  x at
    # every element offset from a boundary, forward and inverse, equals the
    # out-of-place result (another kernel) bit for bit, by either kernel.
    from posenc_fast import _core

    sizes = {kind: size for kind, (size, _) in _core.block_bytes().items()}
    before = _core.set_block_bytes(**dict(sizes, scalar_in_place=scalar_in_place))
    try:
        assert _core.in_place_row_kernel(dim * np.dtype(dtype).itemsize) == (
            "scalar" if scalar_in_place == 0 else "vectors")
        _in_place_rows_at_every_alignment(np.dtype(dtype), dim)
    finally:
        _core.set_block_bytes(*before)


def _in_place_rows_at_every_alignment(dtype, dim):
    rope = pf.RotaryEmbedding(dim, layout="half")
    shape = (1, 4, (16 << 20) // (4 * dim * dtype.itemsize) + 3, dim)
    x = np.random.default_rng(dim).standard_normal(shape).astype(dtype)
    buffer = np.empty(x.size + 64, dtype)
    base = (-buffer.ctypes.data % 64) // dtype.itemsize
    for inverse in (False, True):
        want = rope.apply(x, offset=5, inverse=inverse).tobytes()
        for k in range(64 // dtype.itemsize):
            view = buffer[base + k:base + k + x.size].reshape(shape)
            view[...] = x
            assert rope.apply(view, offset=5, inverse=inverse, out=view) is view
            assert view.tobytes() == want, (inverse, k)
