"""apply_rotary_cos_sin(_qk)'s compiled path (positions None) against its general path, and every pair count.

The compiled walk (``_core.rotate_cos_sin_fast``) must give the general
path's bits (run inside ``helpers.general_path_only``), on every cache view
and thread count, and every pair count the reference's.
"""

import numpy as np
import pytest
from helpers import general_path_only
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

import posenc_fast as pf
from posenc_fast import reference
from test_rotary_cos_sin import DTYPES, LAYOUTS, cases, check, random  # the shared helpers


def _fast(xs, cos, sin, outs, layout="half", inverse=False):
    from posenc_fast._dispatch import kernels

    return kernels.rotate_cos_sin_fast(xs, cos, sin, layout, inverse, outs)


@st.composite
def cache_views(draw, cache_shape, dtype, rng):
    """A cos/sin cache of `cache_shape` laid out as frameworks hand it over."""
    kind = draw(st.sampled_from(["contiguous", "full-width slice", "reversed", "broadcast",
                                 "transposed"]))
    if kind == "full-width slice":  # transformers: cos[..., :dim//2] of (..., dim)
        wide = rng.standard_normal(cache_shape[:-1] + (2 * cache_shape[-1] + 3,))
        return wide.astype(dtype)[..., :cache_shape[-1]]
    if kind == "reversed" and len(cache_shape) > 1:
        return rng.standard_normal(cache_shape).astype(dtype)[::-1]
    if kind == "broadcast" and len(cache_shape) > 1:
        row = rng.standard_normal((1,) * (len(cache_shape) - 1) + cache_shape[-1:])
        return np.broadcast_to(row.astype(dtype), cache_shape)
    if kind == "transposed" and len(cache_shape) > 2:
        swapped = cache_shape[1::-1] + cache_shape[2:]
        return rng.standard_normal(swapped).astype(dtype).swapaxes(0, 1)
    return rng.standard_normal(cache_shape).astype(dtype)


@settings(max_examples=150, deadline=None)
@given(st.data(), cases().filter(lambda case: case["positions"] is None),
       st.sampled_from(["new", "out", "in place"]))
def test_compiled_path_matches_general_path_bitwise(data, case, out_mode):
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal(case["lead"] + (case["dim"],)).astype(case["x_dtype"])
    cos = data.draw(cache_views(case["cache_shape"], case["cache_dtype"], rng))
    sin = data.draw(cache_views(case["cache_shape"], case["cache_dtype"], rng))
    options = dict(layout=case["layout"], inverse=case["inverse"])

    def run():
        target = x.copy()
        out = {"new": None, "out": np.full_like(x, np.nan), "in place": target}[out_mode]
        result = pf.apply_rotary_cos_sin(target, cos, sin, out=out, **options)
        return result, target

    assert _fast((x,), cos, sin, (None,), **options) is not None  # these take the compiled path
    fast, fast_x = run()
    with general_path_only():
        general, general_x = run()
    assert fast.tobytes() == general.tobytes()
    assert fast_x.tobytes() == general_x.tobytes()
    expected = reference.apply_rotary_cos_sin(x, np.asarray(cos), np.asarray(sin), **options)
    scale = np.abs(x).max(initial=0) * (np.abs(cos).max(initial=0) + np.abs(sin).max(initial=0))
    check(fast, expected, case["x_dtype"], case["cache_dtype"], scale)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_qk_matches_general_path(layout, dtype):
    # Llama decode: q (1, 32, 1, 128), k (1, 8, 1, 128), the cache's last row unsqueezed.
    q, k = random((1, 32, 1, 128), dtype), random((1, 8, 1, 128), dtype, seed=1)
    wide = random((1, 1, 1, 128), dtype, seed=2)
    cos, sin = wide[..., :64], random((1, 1, 1, 128), dtype, seed=3)[..., :64]
    assert _fast((q, k), cos, sin, (None, None), layout) is not None
    fast = pf.apply_rotary_cos_sin_qk(q, k, cos, sin, layout=layout)
    with general_path_only():
        general = pf.apply_rotary_cos_sin_qk(q, k, cos, sin, layout=layout)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(fast, general))


@pytest.mark.parametrize("why, change", [
    ("positions given", lambda a: a.update(positions=np.array([0, 1, 2]))),
    ("x not contiguous", lambda a: a.update(x=a["x"][:, ::-1])),
    ("x a subclass", lambda a: a.update(x=a["x"].view(np.memmap))),
    ("x byte-swapped", lambda a: a.update(x=a["x"].astype(">f8"))),
    ("cache of two dtypes", lambda a: a.update(sin=a["sin"].astype(np.float32))),
    ("cache a list", lambda a: a.update(cos=a["cos"].tolist())),
    ("cache strided along pairs", lambda a: a.update(cos=random((3, 8))[:, ::2],
                                                      sin=random((3, 8))[:, ::2])),
    ("inverse a NumPy bool", lambda a: a.update(inverse=np.True_)),
    ("out not contiguous", lambda a: a.update(out=np.zeros((2, 3, 16))[..., ::2])),
    ("out the same view, another object", lambda a: a.update(out=a["x"][...])),
])
def test_calls_the_compiled_path_leaves_to_the_general_path(why, change):
    # Each gives the general path's result; the compiled path declines them.
    args = dict(x=random((2, 3, 8)), cos=random((3, 4), seed=1), sin=random((3, 4), seed=2),
                layout="half", inverse=False, out=None, positions=None)
    change(args)
    x = np.asarray(args["x"])
    expected = reference.apply_rotary_cos_sin(x.astype(np.float64), np.asarray(args["cos"]),
                                              np.asarray(args["sin"]), args["positions"],
                                              inverse=bool(args["inverse"]))
    got = pf.apply_rotary_cos_sin(args["x"], args["cos"], args["sin"], args["positions"],
                                  layout="half", inverse=args["inverse"], out=args["out"])
    assert_allclose(got, expected, rtol=0, atol=1e-6)
    if args["positions"] is None:
        assert _fast((args["x"],), args["cos"], args["sin"], (args["out"],),
                     inverse=args["inverse"]) is None


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("cache", ["(seq, pairs)", "transformers (batch, 1, seq, pairs) view"])
@pytest.mark.parametrize("in_place", [False, True])
def test_compiled_path_in_blocks_of_positions(threads, cache, in_place):
    # Per head, the compiled path walks blocks of 512 KiB of cache rows (512
    # float64 rows of 64 pairs): 2500 positions make five blocks per head.
    batch, heads, seq = 2, 3, 2500
    x = random((batch, heads, seq, 128), seed=4)
    if cache == "(seq, pairs)":
        cos, sin = random((seq, 64), seed=5), random((seq, 64), seed=6)
    else:
        cos = random((batch, seq, 128), seed=5)[:, None, :, :64]
        sin = random((batch, seq, 128), seed=6)[:, None, :, :64]
    before = pf.get_num_threads()
    try:
        pf.set_num_threads(threads)
        target = x.copy()
        got = pf.apply_rotary_cos_sin(target, cos, sin, out=target if in_place else None)
        with general_path_only():
            want = pf.apply_rotary_cos_sin(x, cos, sin)
    finally:
        pf.set_num_threads(before)
    assert got.tobytes() == want.tobytes()
    rows = [(0, 0, 0), (0, 2, 511), (1, 1, 512), (1, 2, seq - 1)]
    for b, h, s in rows:
        c, sn = np.broadcast_to(cos, (batch, heads, seq, 64))[b, h, s], \
            np.broadcast_to(sin, (batch, heads, seq, 64))[b, h, s]
        assert_array_equal(got[b, h, s], reference.rotate_vector_cos_sin(x[b, h, s], c, sn))


@pytest.mark.parametrize("npairs", [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cache_dtype", DTYPES)
@pytest.mark.parametrize("x_dtype", DTYPES)
def test_every_pair_count_matches_reference(npairs, layout, x_dtype, cache_dtype):
    # Rows in cache go through vectors of 2-16 lanes (by ISA and dtype) and
    # finish the pairs past the last full vector with scalar code: every
    # split of a row, with and without positions, in place and not.
    x = random((3, 5, 2 * npairs + 3), x_dtype, seed=npairs)
    cos = random((5, npairs), cache_dtype, seed=100 + npairs)
    sin = random((5, npairs), cache_dtype, seed=200 + npairs)
    expected = reference.apply_rotary_cos_sin(x, cos, sin, layout=layout)
    scale = np.abs(x).max() * (np.abs(cos).max() + np.abs(sin).max())
    for positions in (None, np.arange(5)):
        check(pf.apply_rotary_cos_sin(x, cos, sin, positions, layout=layout), expected,
              x_dtype, cache_dtype, scale)
        in_place = x.copy()
        pf.apply_rotary_cos_sin(in_place, cos, sin, positions, layout=layout, out=in_place)
        check(in_place, expected, x_dtype, cache_dtype, scale)
