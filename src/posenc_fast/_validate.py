"""Argument checks shared by the public functions.

Every public function validates here, before any kernel runs, so that a bad
call raises ``TypeError``/``ValueError`` naming the argument and writes
nothing.  The kernels trust what passes.  (The compiled fast paths of
``RotaryEmbedding.apply``/``apply_qk`` and ``apply_rotary_cos_sin(_qk)`` take
only calls that already pass these rules and hand everything else to the
general path, which checks here.)
"""

import math
import numbers
import operator
from collections.abc import Mapping, Sequence

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
# Half types: stored in 16 bits, computed in float32 and rounded once.
HALF_TYPES = (np.dtype(np.float16), BFLOAT16)
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64)) + HALF_TYPES
FLOAT_NAMES = "float16, bfloat16, float32 or float64"
LAYOUTS_ROTARY = ("interleaved", "half")
LAYOUTS_SINUSOIDAL = ("interleaved", "split")


def float_array(x, name: str, axes: tuple[str, ...] = ()) -> np.ndarray:
    """Return `x` as a native-byte-order ndarray of a kernel dtype (no copy if it is one).

    The kernel dtypes are float16, bfloat16 (``ml_dtypes.bfloat16``), float32
    and float64; anything else (float8, integers, ...) raises TypeError.
    `axes` names the trailing axes `x` must have (e.g. ``("seq", "dim")``):
    ValueError if it has fewer dimensions.
    """
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be a {FLOAT_NAMES} array: {exc}") from None
    dtype = x.dtype
    if dtype.newbyteorder("=") not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a {FLOAT_NAMES} array, got dtype {dtype}")
    if x.ndim < len(axes):
        raise ValueError(f"{name} must have shape (..., {', '.join(axes)}) with at least "
                         f"{len(axes)} dimensions, got shape {x.shape}")
    if not dtype.isnative:
        x = x.astype(dtype.newbyteorder("="))
    return x


def empty(shape, dtype, names: str) -> np.ndarray:
    """``np.empty(shape, dtype)``; a shape NumPy cannot hold (even an empty one) refused naming `names`,
    the arguments that set it."""
    try:
        return np.empty(shape, dtype=dtype)
    except ValueError as error:  # "array is too big", "maximum supported dimension"
        raise ValueError(f"the array of shape {shape} set by {names} is more than NumPy can hold ({error})") from None


def table_dtype(dtype, name: str = "dtype") -> np.dtype:
    """Return the kernel dtype a `dtype=` argument names (also "bfloat16"), else TypeError."""
    try:
        resolved = BFLOAT16 if isinstance(dtype, str) and dtype == "bfloat16" else np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{name} must be {FLOAT_NAMES}, got {dtype!r}") from None
    if resolved not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be {FLOAT_NAMES}, got {resolved}")
    return resolved if resolved == BFLOAT16 else np.dtype(resolved.name)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a kernel computes `dtype` data in: float32 for a half type."""
    return np.dtype(np.float32) if dtype in HALF_TYPES else dtype


def rotation_tables(cos: np.ndarray, sin: np.ndarray, dtype: np.dtype, name: str):
    """cos/sin tables for rotating `dtype` data named `name` (a half type widened exactly).

    float32/float64 data take float32 or float64 tables (a half table is
    widened to float32); half data take float32 or their own type.
    """
    if dtype in HALF_TYPES:
        if cos.dtype not in (np.dtype(np.float32), dtype):
            raise TypeError(f"cos and sin must be float32 or {dtype} for {dtype} {name}, "
                            f"got {cos.dtype}")
        return cos, sin
    if cos.dtype in HALF_TYPES:
        return cos.astype(np.float32), sin.astype(np.float32)
    return cos, sin


def flag(value, name: str) -> bool:
    """Return `value` as a Python bool: only bool and numpy.bool_ are accepted."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def integer(value, name: str, minimum: int | None = None) -> int:
    """Return `value` as a Python int (bool refused), checked against `minimum`.

    numpy.bool_ is refused explicitly: NumPy 1.x would let it through
    ``operator.index`` with only a DeprecationWarning.
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        result = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if minimum is not None and result < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {result}")
    return result


def whole_number(value, name: str, minimum: int | None = None) -> int:
    """As `integer`, but a real number holding a whole value (``4.0``) is accepted too."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        if not (math.isfinite(value) and float(value).is_integer()):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        value = int(value)
    return integer(value, name, minimum)


def rotary_dim(value, dim: int | None = None) -> int:
    """Return a RoPE `rotary_dim`: an even int >= 2, and <= `dim` when given."""
    value = integer(value, "rotary_dim")
    if dim is None and (value % 2 or value < 2):
        raise ValueError(f"rotary_dim must be an even int >= 2, got {value}")
    if dim is not None and (value % 2 or not 2 <= value <= dim):
        raise ValueError(f"rotary_dim must be even with 2 <= rotary_dim <= dim={dim}, "
                         f"got {value}")
    return value


def rotary_start(value, dim: int, rotary_dim: int) -> int:
    """Return a RoPE `rotary_start`: an int >= 0 with rotary_start + rotary_dim <= dim."""
    value = integer(value, "rotary_start", minimum=0)
    if value + rotary_dim > dim:
        raise ValueError(f"rotary_start + rotary_dim must be <= dim={dim}, got {value} + "
                         f"{rotary_dim}")
    return value


def real(value, name: str, *, positive: bool = False, minimum: float | None = None) -> float:
    """Return `value` as a finite Python float (bool refused); optionally > 0 or >= `minimum`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        # a bfloat16 scalar is no numbers.Real (ml_dtypes does not register it), nor of kind "f"
        if not (isinstance(value, BFLOAT16.type) or isinstance(value, np.ndarray) and value.ndim == 0
                and (value.dtype.kind in "iuf" or value.dtype == BFLOAT16)):
            raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    try:
        result = float(value)
    except OverflowError:  # an int beyond the float range
        raise ValueError(f"{name} must be finite, got an integer too large for a float") from None
    if not math.isfinite(result):
        raise ValueError(f"{name} must be finite, got {result}")
    if positive and result <= 0:
        raise ValueError(f"{name} must be > 0, got {result}")
    if minimum is not None and result < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, got {result}")
    return result


def positive_reals(values, name: str, length: int, length_name: str) -> np.ndarray:
    """Return a list of `length` finite numbers > 0 as a float64 array.

    `length_name` says in a message where the length comes from.
    """
    if (isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray))
            or np.ndim(values) == 0):
        raise TypeError(f"{name} must be a list of numbers, got {type(values).__name__}")
    if len(values) != length:
        raise ValueError(f"{name} must have {length_name} = {length} entries, got {len(values)}")
    for item in values:
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, numbers.Real):
            raise TypeError(f"{name} must hold real numbers, got {type(item).__name__} "
                            f"({item!r})")
    array = np.array(values, dtype=np.float64)
    bad = ~(np.isfinite(array) & (array > 0.0))
    if bad.any():
        raise ValueError(f"{name} must hold finite numbers > 0, got {array[bad][0]!r}")
    return array


def mapping_or_none(value, name: str) -> Mapping | None:
    """Return `value` if it is a Mapping or None, else raise TypeError."""
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict or None, got {type(value).__name__}")
    return value


def choice(value, name: str, options: tuple[str, ...]) -> str:
    """Return `value` if it is one of `options`, else raise ValueError."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value


def _as_array(values, name: str, what: str) -> np.ndarray:
    if isinstance(values, np.ndarray):  # a subclass as a plain view: np.matrix keeps 2-D through reshape(-1)
        return values if type(values) is np.ndarray else values.view(np.ndarray)
    try:
        return np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be {what}: {exc}") from None


def integer_array(positions, name: str = "positions") -> np.ndarray:
    """Return integer positions as an ndarray of their own integer dtype (no copy)."""
    positions = _as_array(positions, name, "an integer array")
    if positions.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {positions.dtype}")
    return positions


def positions_array(positions, name: str = "positions") -> np.ndarray:
    """Return real positions as a float64 ndarray (a new array), checked finite."""
    positions = _as_array(positions, name, "an array of real numbers")
    kind = "f" if positions.dtype == BFLOAT16 else positions.dtype.kind
    if kind not in "iuf":
        raise TypeError(f"{name} must be an array of real numbers (integers or {FLOAT_NAMES}), "
                        f"got dtype {positions.dtype}")
    values = positions.astype(np.float64)
    if kind == "f" and not np.isfinite(values).all():
        bad = values.ravel()[~np.isfinite(values.ravel())][0]
        raise ValueError(f"{name} must be finite, got {bad}")
    return values


def with_offset(positions: np.ndarray, offset: float, name: str = "positions") -> np.ndarray:
    """Add `offset` to float64 `positions` in place and check the result is finite."""
    if offset:
        with np.errstate(over="ignore", invalid="ignore"):  # checked just below
            positions += offset
        if not np.isfinite(positions).all():
            raise ValueError(f"{name} + offset must be finite")
    return positions


def finite_angles(positions: np.ndarray, freqs: np.ndarray, name: str = "positions") -> None:
    """Raise ValueError unless every angle position * frequency is finite in float64."""
    if positions.size and freqs.size:
        largest_position = float(np.abs(positions).max())
        largest_freq = float(np.abs(freqs).max())
        if not math.isfinite(largest_position * largest_freq):
            raise ValueError(f"{name} * frequency must be finite: the largest |position| "
                             f"{largest_position:g} times the largest frequency "
                             f"{largest_freq:g} overflows float64 (a base too close to 0, "
                             f"or positions too large)")


def broadcast_target(shape: tuple, target: tuple, name: str, target_name: str) -> None:
    """Raise ValueError unless an array of `shape` broadcasts to exactly `target`."""
    try:
        result = np.broadcast_shapes(shape, target)
    except ValueError:
        result = None
    if result != target:
        raise ValueError(f"{name} of shape {shape} does not broadcast against "
                         f"{target_name} = {target}")


def seq_axis_index(seq_axis, ndim: int) -> int:
    """Resolve `seq_axis` (an axis of x other than the last) to a non-negative index."""
    axis = integer(seq_axis, "seq_axis")
    resolved = axis + ndim if axis < 0 else axis
    if not 0 <= resolved < ndim - 1:
        raise ValueError(f"seq_axis must name an axis of x other than the last "
                         f"(x has {ndim} dimensions), got {axis}")
    return resolved


def _same_view(a: np.ndarray, b: np.ndarray) -> bool:
    if a is b:  # the usual in-place call; __array_interface__ builds a dict (~2 us)
        return True
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype)


def overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    """Return True if `a` and `b` share any byte of memory."""
    return np.may_share_memory(a, b) and np.shares_memory(a, b)


def indices_apart(indices: dict, written: dict) -> None:
    """Raise ValueError if an index array (positions, slots) shares memory with an array the call
    writes: the kernels read the indices while they write, so a rotation would change them."""
    for name, x in indices.items():
        for other, w in written.items():
            if w is not None and overlaps(x, w):
                raise ValueError(f"{name} shares memory with {other}, which the call writes; pass separate "
                                 f"arrays")


def elements_apart(x: np.ndarray) -> bool:
    """True when no two elements of `x` can share memory: along its axes sorted by stride, each
    stride spans the axes before it (an expanded, stride-0 view fails; so may a rare
    interleaved layout that does not overlap)."""
    extent = x.itemsize
    axes = sorted(((abs(s), n) for n, s in zip(x.shape, x.strides) if n > 1))
    for stride, size in axes:
        if stride < extent:
            return False
        extent = stride * (size - 1) + extent
    return True


def output(out, name: str, shape: tuple, dtype: np.dtype, *, may_be=(), must_not_overlap=()):
    """Check a user's `out`; return it (or None), and whether it is one of `may_be`.

    `out` must be an ndarray of exactly `shape` and `dtype`, writeable, and
    either be the very same view as one of `may_be` (in place) or share no
    memory with any array in `may_be` or `must_not_overlap`.
    """
    if out is None:
        return None, False
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {out.shape}")
    if out.dtype != dtype:
        if out.dtype == dtype.newbyteorder():
            raise ValueError(f"{name} must be {dtype} in native byte order, got {out.dtype} (the inputs "
                             f"are read in native order)")
        raise ValueError(f"{name} must have dtype {dtype}, got {out.dtype}")
    if not out.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    if out.size and not elements_apart(out):  # the result would depend on the order of the writes
        raise ValueError(f"{name} of strides {out.strides} has elements that share memory (an expanded "
                         f"view?); pass an array of its own")
    in_place = False
    for other in may_be:
        if _same_view(out, other):
            in_place = True
        elif overlaps(out, other):
            raise ValueError(f"{name} overlaps an input without being the same array; pass "
                             f"the input itself for in-place operation or a separate array")
    for other in must_not_overlap:
        if other is not None and overlaps(out, other):
            raise ValueError(f"{name} overlaps another input or output")
    return out, in_place
