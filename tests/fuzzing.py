"""Strategies and checks shared by the fuzz tests (test_fuzz.py, test_fuzz_rope.py).

Each fuzz test draws arguments that are valid or invalid in known ways,
predicts whether the call must fail, calls the function with every warning
turned into an error, and then checks one of two outcomes:

* the call was predicted valid: it returned a result equal (to a tolerance
  derived from the dtype and the size of the angles) to ``posenc_fast.reference``,
  and left every input it does not write bitwise unchanged;
* the call was predicted invalid: it raised TypeError or ValueError and left
  every array it was given (inputs and ``out``) bitwise unchanged.

Any other exception fails the test.  ``POSENC_FAST_FUZZ_EXAMPLES`` sets the
number of examples per test (default 120).
"""

import math
import numbers
import os
import warnings

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from helpers import general_path_only
from posenc_fast._tolerance import EPS64, RECURRENCE_ATOL

EXAMPLES = int(os.environ.get("POSENC_FAST_FUZZ_EXAMPLES", "120"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


BF16 = np.dtype(ml_dtypes.bfloat16)
HALF_TYPES = [np.dtype(np.float16), BF16]
FLOAT_DTYPES = [np.dtype(np.float32), np.dtype(np.float64)] + HALF_TYPES
# Data dtypes: mostly the supported ones, then every kind of wrong one.


@st.composite
def maybe(draw, good, bad, one_in=12):
    """Mostly `good` values, about one draw in `one_in` from `bad` (shrinking towards good).

    (``st.one_of(good, good, ..., bad)`` would not do: hypothesis picks the
    distinct branches about equally often.)
    """
    return draw(bad) if draw(st.integers(0, one_in - 1)) == one_in - 1 else draw(good)


def choose(good: list, bad: list, one_in=12):
    """`maybe` over two lists of values."""
    return maybe(st.sampled_from(good), st.sampled_from(bad), one_in) if bad else \
        st.sampled_from(good)


DATA_DTYPES = choose(["float32", "float64", ">f4", ">f8", "float16", BF16],
                     ["float8_e4m3fn", "int32", "int64", "uint8", "bool", "complex64",
                      "complex128", "object", "U3"], one_in=8)
LAYOUTS = ["c"] * 6 + ["fortran", "strided", "reversed", "broadcast", "readonly"]


class Outcome:
    """What a call did: `result` or the TypeError/ValueError `error` it raised."""

    def __init__(self, result=None, error=None):
        self.result = result
        self.error = error

    def __repr__(self):
        return f"Outcome(error={self.error!r})" if self.error else "Outcome(ok)"


def call(function, *args, allow_memory_error=False, **kwargs) -> Outcome:
    """Call with warnings as errors; TypeError/ValueError are outcomes, anything else escapes.

    `allow_memory_error`: the arguments ask for an allocation no machine can
    make (more than 2**40 bytes), so MemoryError is an outcome too.
    """
    expected = (TypeError, ValueError, MemoryError) if allow_memory_error else (TypeError,
                                                                                ValueError)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            return Outcome(result=function(*args, **kwargs))
        except expected as error:
            return Outcome(error=error)


class Snapshot:
    """Bytes of every ndarray among `objects` (lists/tuples searched), to compare later."""

    def __init__(self, *objects):
        self.items = []
        seen = set()
        for obj in objects:
            for a in (obj if isinstance(obj, (list, tuple)) else [obj]):
                if isinstance(a, np.ndarray) and id(a) not in seen and a.dtype.kind != "O":
                    seen.add(id(a))
                    self.items.append((a, a.tobytes()))

    def changed(self, exclude=()) -> list:
        """Arrays whose bytes changed, other than those sharing memory with `exclude`."""
        bad = []
        for a, before in self.items:
            if any(e is not None and isinstance(e, np.ndarray) and np.shares_memory(a, e)
                   for e in exclude):
                continue
            if a.tobytes() != before:
                bad.append(a)
        return bad


def check(outcome: Outcome, expect_error, snapshot: Snapshot, written=()):
    """Common checks: predicted error <=> raised; nothing written on failure.

    `expect_error`: True (must raise), False (must succeed) or None (either).
    `written`: arrays a successful call may write (out, or x in place).
    Returns True when the call succeeded (the caller then checks the values).
    """
    if outcome.error is not None:
        assert expect_error is not False, f"unexpected {outcome.error!r}"
        changed = snapshot.changed()
        assert not changed, f"a failing call ({outcome.error!r}) modified an argument"
        return False
    assert expect_error is not True, "the call succeeded but should have raised"
    changed = snapshot.changed(exclude=written)
    assert not changed, "a call modified an input it does not own"
    return True


# ---------------------------------------------------------------------------
# values and arrays


@st.composite
def lead_shapes(draw, min_dims=0, max_dims=5, max_rows=48):
    """Leading shapes: up to `max_dims` axes of 0..3, at most `max_rows` rows in all."""
    shape = draw(st.lists(st.integers(0, 3), min_size=min_dims, max_size=max_dims))
    while math.prod(shape) > max_rows:
        shape[shape.index(max(shape))] -= 1
    return tuple(shape)


def _values(seed: int, shape: tuple) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-4.0, 4.0, size=shape)


def _cast(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "object":
        return values.astype(object)
    if dtype == "U3":
        return values.astype("U3")
    return values.astype(dtype)


@st.composite
def arrays(draw, shape, dtype=None, layout=None):
    """An array of `shape` with random values in [-4, 4], drawn dtype and memory layout.

    Layouts: C order, Fortran order, a strided (every other element) view,
    an axis reversed (negative stride), a broadcast (zero-stride, read-only)
    view, a read-only array.
    """
    dtype = draw(DATA_DTYPES) if dtype is None else dtype
    layout = draw(st.sampled_from(LAYOUTS)) if layout is None else layout
    seed = draw(st.integers(0, 2**32 - 1))
    shape = tuple(shape)
    if layout == "broadcast" and shape:
        axis = draw(st.integers(0, len(shape) - 1))
        small = shape[:axis] + (1,) + shape[axis + 1:]
        return np.broadcast_to(_cast(_values(seed, small), dtype), shape)
    a = _cast(_values(seed, shape), dtype)
    if layout == "fortran":
        return np.asfortranarray(a)
    if layout == "strided" and shape:
        axis = draw(st.integers(0, len(shape) - 1))
        big_shape = shape[:axis] + (2 * shape[axis],) + shape[axis + 1:]
        big = _cast(_values(seed, big_shape), dtype)
        return big[(slice(None),) * axis + (slice(None, None, 2),)]
    if layout == "reversed" and shape:
        axis = draw(st.integers(0, len(shape) - 1))
        return np.flip(a, axis)
    if layout == "readonly":
        a.flags.writeable = False
    return np.ascontiguousarray(a) if a.ndim else a


def is_float_data(a) -> bool:
    """True if `a` is a float16/bfloat16/float32/float64 array (any byte order) or converts to one."""
    try:
        dtype = np.asarray(a).dtype
    except (TypeError, ValueError):
        return False
    return dtype.newbyteorder("=") in FLOAT_DTYPES


def native(dtype) -> np.dtype:
    dtype = BF16 if isinstance(dtype, str) and dtype == "bfloat16" else np.dtype(dtype)
    return dtype.newbyteorder("=")


def table_ok(data_dtype, table_dtype) -> bool:
    """True if cos/sin of `table_dtype` may rotate `data_dtype` data (half data: float32 or own)."""
    if native(data_dtype) in HALF_TYPES:
        return native(table_dtype) in (np.dtype(np.float32), native(data_dtype))
    return True


# Scalars: good and bad values of each kind of parameter.
HUGE_INTS = [2**31, 2**32, 2**40, 2**53, 2**62, 2**63, 2**64, 10**30, 10**400]
JUNK = [None, "3", b"3", 1j, [1], (), {}, object(), np.array([1, 2])]


def int_values(low, high):
    return st.one_of(st.integers(low, high), st.sampled_from([np.int64(low), np.int32(high)]))


def bad_ints():
    return st.one_of(st.sampled_from([True, False, 2.0, 1.5, float("nan"), np.float64(3.0),
                                      np.bool_(True), -1, -(2**63)]), st.sampled_from(JUNK))


def int_ok(value, minimum=None) -> bool:
    """What posenc_fast accepts as an integer argument (bool refused)."""
    if isinstance(value, (bool, np.bool_)) or not hasattr(value, "__index__"):
        return False
    if isinstance(value, np.ndarray):
        if value.ndim != 0 and value.size != 1:
            return False
        if value.ndim:
            return False  # operator.index refuses arrays with dimensions
    return minimum is None or value.__index__() >= minimum


def real_values():
    return st.one_of(
        st.floats(-1e6, 1e6, allow_nan=False),
        st.integers(-(10**6), 10**6),
        st.sampled_from([0, 0.5, -3.25, 2**31, 2**32, 2**40, float(2**53), -(2**40), 1e15,
                         np.float32(1.5), np.int64(7), np.float64(-2.5), np.array(3.0)]),
    )


def bad_reals():
    return st.sampled_from([float("nan"), float("inf"), -float("inf"), True, np.bool_(False),
                            10**400, "1", 1j, None, [1.0], np.array([1.0, 2.0]), np.nan])


def real_ok(value) -> bool:
    """What posenc_fast accepts as a real argument: finite, bool refused."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, np.ndarray):
        if value.ndim != 0 or value.dtype.kind not in "iuf":
            return False
    elif not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def params(good, bad, bad_weight=0.15):
    """Mostly `good` values, sometimes `bad` ones."""
    return st.one_of(good, bad) if bad_weight else good


# ---------------------------------------------------------------------------
# out= arguments


OUT_KINDS = choose(["none", "none", "none", "fresh", "in_place", "fresh_strided", "fortran"],
                   ["wrong_dtype", "wrong_shape", "readonly", "overlap", "list", "other_order"],
                   one_in=6)


def make_out(kind: str, shape: tuple, dtype, x=None):
    """An `out` argument of `kind` for a result of `shape` and `dtype` (x: the input)."""
    dtype = np.dtype(dtype)
    if kind == "none":
        return None
    if kind == "fresh":
        return np.full(shape, 7.0, dtype=dtype)
    if kind == "fresh_strided":
        if not shape:
            return np.full(shape, 7.0, dtype=dtype)
        big = np.full(shape[:-1] + (2 * shape[-1] + 1,), 7.0, dtype=dtype)
        return big[..., 1::2][..., :shape[-1]]
    if kind == "fortran":
        return np.asfortranarray(np.full(shape, 7.0, dtype=dtype))
    if kind == "in_place":
        return x
    if kind == "wrong_dtype":
        other = np.float64 if dtype == np.float32 else np.float32
        return np.full(shape, 7.0, dtype=other)
    if kind == "wrong_shape":
        return np.full(shape + (1,), 7.0, dtype=dtype)
    if kind == "readonly":
        out = np.full(shape, 7.0, dtype=dtype)
        out.flags.writeable = False
        return out
    if kind == "overlap":
        # A view of x's memory shifted by one element (partial overlap).
        if isinstance(x, np.ndarray) and x.size > 1 and x.flags.c_contiguous and x.flags.writeable:
            flat = x.reshape(-1)
            window = np.lib.stride_tricks.as_strided(flat[1:], shape=(x.size - 1,))
            if math.prod(shape) <= x.size - 1:
                return window[:math.prod(shape)].reshape(shape).view(x.dtype)
        return np.full(shape, 7.0, dtype=dtype)
    if kind == "list":
        return np.full(shape, 7.0, dtype=dtype).tolist()
    if kind == "other_order":
        return np.full(shape, 7.0, dtype=dtype.newbyteorder(">"))
    raise AssertionError(kind)


def out_ok(out, shape: tuple, dtype, may_be=None, must_not_overlap=()) -> tuple[bool, bool]:
    """(valid, in_place) for a user's `out` under the rules the docstrings state."""
    if out is None:
        return True, False
    if not isinstance(out, np.ndarray):
        return False, False
    if out.shape != tuple(shape) or out.dtype != np.dtype(dtype) or not out.flags.writeable:
        return False, False
    in_place = False
    if isinstance(may_be, np.ndarray):
        same = (out.__array_interface__["data"][0] == may_be.__array_interface__["data"][0]
                and out.shape == may_be.shape and out.strides == may_be.strides
                and out.dtype == may_be.dtype)
        if same:
            in_place = True
        elif np.shares_memory(out, may_be):
            return False, False
    for other in must_not_overlap:
        if isinstance(other, np.ndarray) and np.shares_memory(out, other):
            return False, False
    return True, in_place


# ---------------------------------------------------------------------------
# positions


@st.composite
def positions_for(draw, lead: tuple, allow_none=True, integral=False):
    """A positions argument for leading shape `lead`: None, scalar, list or array.

    Mostly valid (broadcasting against `lead`), sometimes the wrong shape, a
    non-finite value, a huge value or the wrong dtype.
    """
    good = ["none", "array", "array", "scalar", "list"] if allow_none else ["array", "scalar",
                                                                            "list"]
    kind = draw(choose(good, ["wrong_shape", "special"], one_in=8))
    if kind == "none":
        return None
    # A shape that broadcasts to lead: a suffix of lead with some axes set to 1.
    k = draw(st.integers(0, len(lead)))
    shape = [1 if draw(st.booleans()) else n for n in lead[len(lead) - k:]]
    scale = draw(st.sampled_from([10, 1000, 2**20, 2**31, 2**40]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    low = 0 if draw(st.booleans()) else -scale
    values = rng.integers(low, scale + 1, size=shape)
    if integral:
        dtype = draw(choose(["int64", "int32", "uint16"],
                            ["float64", "float32", "bool", "object", "U3", "complex128"],
                            one_in=10))
    else:
        dtype = draw(choose(["int64", "int32", "uint16", "float64", "float32"],
                            ["bool", "object", "U3", "complex128"], one_in=10))
    if kind == "scalar":
        value = int(values.reshape(-1)[0]) if values.size else 3
        return draw(st.sampled_from([value, np.int64(value), float(value), np.float32(value)]))
    if kind == "list":
        return values.tolist()
    if kind == "wrong_shape":
        return np.zeros(tuple(lead) + (2,) if draw(st.booleans()) else (len(lead) + 5,),
                        dtype=np.int64)
    if kind == "special":
        special = draw(st.sampled_from([np.nan, np.inf, -np.inf, 2.0**62, 2**62, -(2**62),
                                        0.5, -1.5, 2.0**53, 1e300]))
        arr = values.astype(np.float64 if isinstance(special, float) else np.int64)
        if arr.size:
            arr.reshape(-1)[draw(st.integers(0, arr.size - 1))] = special
        return arr
    if dtype in ("uint16",) and low < 0:
        dtype = "int64"
    if dtype == "float32" and scale > 2**20:
        dtype = "float64"
    arr = _cast(values.astype(np.float64), dtype) if dtype in ("object", "U3") else values.astype(dtype)
    layout = draw(st.sampled_from(["c", "reversed", "readonly", "big_endian"]))
    if layout == "reversed" and arr.ndim:
        arr = np.flip(arr, -1)
    elif layout == "readonly":
        arr.flags.writeable = False
    elif layout == "big_endian" and arr.dtype.kind in "iuf":
        arr = arr.astype(arr.dtype.newbyteorder(">"))
    return arr


def positions_value(positions, lead: tuple, integral=False):
    """The float64 positions (broadcast to `lead`) a valid call uses; None if invalid.

    Mirrors the docstrings: a real (or, with `integral`, integer) array-like, finite,
    broadcasting exactly to `lead`.
    """
    try:
        arr = np.asarray(positions)
    except (TypeError, ValueError):
        return None
    if arr.dtype.kind not in ("iu" if integral else "iuf"):
        return None
    values = arr.astype(np.float64)
    if not np.isfinite(values).all():
        return None
    try:
        if np.broadcast_shapes(values.shape, lead) != tuple(lead):
            return None
    except ValueError:
        return None
    return np.broadcast_to(values, lead), arr


# ---------------------------------------------------------------------------
# comparing with the reference


def assert_close(got: np.ndarray, want: np.ndarray, dtype, scale: float, max_angle: float = 0.0):
    """|got - want| within a few roundings of `dtype` at magnitude `scale`, plus angle rounding.

    The kernels use cos/sin of the exact product p*w, the reference sin(fl(p*w)):
    they may differ by up to half an ulp of the angle (times the magnitude).  A
    half type is computed in float32 and rounded once: within one of its ulps
    of `want` (times the magnitude), and inf where `want` lies past its range.
    """
    got = np.asarray(got)
    assert got.dtype == native(dtype), (got.dtype, dtype)
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    want = np.asarray(want, dtype=np.float64)
    got64 = got.astype(np.float64)
    if native(dtype) in HALF_TYPES:
        info = ml_dtypes.finfo(native(dtype))
        past = np.abs(want) >= float(info.max) * (1 + float(info.eps))
        assert (got64[past] == np.sign(want[past]) * np.inf).all(), "overflow must give inf"
        want, got64 = want[~past], got64[~past]
        rel = 2 * float(info.eps)
    else:
        rel = 4 * float(np.finfo(np.float32).eps) if native(dtype) == np.float32 else 1e-12
    tol = (rel + 4 * EPS64 * max_angle + RECURRENCE_ATOL) * max(scale, 1.0)
    assert np.isfinite(got64).all() or not np.isfinite(want).all(), "non-finite result"
    err = np.abs(got64 - want)
    assert not (err > tol).any(), (f"max error {err.max():.3g} > tolerance {tol:.3g} "
                                   f"(scale {scale:.3g}, angle {max_angle:.3g})")


def magnitude(*arrays) -> float:
    """The largest |value| among float arrays (1 at least)."""
    m = 1.0
    for a in arrays:
        if a is not None and np.size(a):
            m = max(m, float(np.max(np.abs(np.asarray(a, dtype=np.float64)))))
    return m


# the layout and dtype arguments the fuzz tests draw, and whether a dtype argument is valid
LAYOUT_VALUES = choose(["interleaved", "split"], ["half", "Half", 3, None])
ROTARY_LAYOUTS = choose(["interleaved", "half"], ["split", "Half", 3, None])
DTYPE_ARGS = choose([np.float32, np.float64, "float32", "f8", np.dtype("float32"), np.float16,
                     "bfloat16"],
                    [ml_dtypes.float8_e5m2, np.int64, "bogus", object, complex])


def dtype_ok(dtype) -> bool:
    try:
        return native(dtype) in FLOAT_DTYPES
    except TypeError:
        return False


def agree(function, make_args):
    """Call `function` on fresh arguments (``make_args()``: them, and the arrays it may write) with the
    compiled fast paths on and off: the same outcome, both raising a TypeError or ValueError with
    nothing written, or both writing the same bits."""
    outcomes, written = [], []
    for fast in (True, False):
        args, outputs = make_args()
        snapshot = Snapshot(list(args))
        if fast:
            outcome = call(function, *args)
        else:
            with general_path_only():
                outcome = call(function, *args)
        outcomes.append(outcome)
        if outcome.error is not None:
            assert not snapshot.changed(), f"a failing call ({outcome.error!r}) wrote an argument"
        written.append([None if x is None else x.tobytes() for x in outputs])
    fast, general = outcomes
    assert type(fast.error) is type(general.error), (fast, general)
    assert written[0] == written[1], "the compiled path wrote other bits than the general path"
