"""The parts of ``python -m posenc_fast check`` (`posenc_fast._cli_check`) under its cases.

`Draw` makes the random choices of one case and records them for its
description; `Comparison` holds one result with what it must equal and says
why it does not (tolerances: `posenc_fast._tolerance.tolerance`).
"""

from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._tolerance import tolerance

Array = NDArray[Any]


class Comparison:
    """One result of a case, with what it must equal and the size of its inputs.

    Parameters
    ----------
    name : str
        What is compared (``"q"``, ``"cos"``, ...).
    got : ndarray
        The compiled result.
    want : ndarray
        The reference value (float64, or int64 for index tables).
    dtype : numpy dtype
        The dtype `got` must have.
    scale : float or ndarray, optional
        Magnitude of the inputs behind each element (broadcasts to `want`).
    angle : float or ndarray, optional
        Largest ``|position * frequency|`` behind each element.
    same_as : ndarray, optional
        The ``out`` argument, which `got` must be.
    """

    def __init__(self, name: str, got: Any, want: Array, dtype: Any, *, scale: Any = 1.0,
                 angle: Any = 0.0, same_as: Array | None = None) -> None:
        self.name = name
        self.got = got
        self.want = want
        self.dtype = np.dtype(dtype)
        self.scale = scale
        self.angle = angle
        self.same_as = same_as

    def problem(self) -> str | None:
        """Return why `got` is wrong, or None."""
        got = self.got
        if not isinstance(got, np.ndarray):
            return f"{self.name}: returned {type(got).__name__}, not an ndarray"
        if got.shape != self.want.shape or got.dtype != self.dtype:
            return (f"{self.name}: got {got.dtype}{got.shape}, "
                    f"expected {self.dtype}{self.want.shape}")
        if self.same_as is not None and got is not self.same_as:
            return f"{self.name}: did not return the out array"
        if self.dtype.kind in "iu":
            wrong = np.count_nonzero(got != self.want)
            return f"{self.name}: {wrong} entries differ" if wrong else None
        err = np.abs(got.astype(np.float64) - self.want)
        tol = tolerance(self.want, self.dtype, scale=self.scale, angle=self.angle)
        bad = ~(err <= tol)  # NaN counts as bad
        if not bad.any():
            return None
        flat = int(np.argmax(np.where(bad, err / np.maximum(tol, 1e-300), -1.0)))
        worst = tuple(int(i) for i in np.unravel_index(flat, err.shape))
        return (f"{self.name}: {np.count_nonzero(bad)} of {err.size} off; at {worst} "
                f"got {float(got[worst])!r}, want {float(self.want[worst])!r} "
                f"(tol {float(tol[worst]):.1e})")


class Draw:
    """Random choices of one case, recorded for its description.

    Parameters
    ----------
    rng : numpy.random.Generator
    """

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.facts: list[str] = []

    def pick(self, options: Any, label: str | None = None) -> Any:
        """Return one of `options`; note it as ``label=value`` when `label` is given."""
        value = options[int(self.rng.integers(len(options)))]
        if label is not None:
            self.note(label, value)
        return value

    def integer(self, low: int, high: int, label: str | None = None) -> int:
        """Return an integer in ``[low, high]``."""
        value = int(self.rng.integers(low, high + 1))
        if label is not None:
            self.note(label, value)
        return value

    def note(self, label: str, value: Any) -> None:
        """Record a fact for the description."""
        if isinstance(value, np.dtype) or isinstance(value, type):
            value = np.dtype(value).name
        self.facts.append(f"{label}={value}")

    def data(self, shape: tuple[int, ...], dtype: Any, label: str = "x") -> Array:
        """Return random normal data of `shape` in a random memory layout."""
        layout = self.pick(("C", "C", "strided", "transposed"))
        if layout != "C":
            self.note(f"{label}_layout", layout)
        values = self.rng.standard_normal(shape)
        if layout == "strided":
            wide = np.zeros(shape[:-1] + (2 * shape[-1],), dtype=dtype)
            wide[..., ::2] = values
            return wide[..., ::2]
        if layout == "transposed" and len(shape) >= 2:
            return np.swapaxes(np.swapaxes(values, -1, -2).astype(dtype).copy(), -1, -2)
        return values.astype(dtype)

    def out_for(self, x: Array, label: str = "out") -> tuple[Array | None, bool]:
        """Return ``(out, in_place)``: None, a fresh array, a strided array or `x` itself."""
        mode = self.pick(("none", "none", "array", "strided", "in-place"))
        if mode != "none":
            self.note(label, mode)
        if mode == "array":
            return np.full(x.shape, np.nan, dtype=x.dtype), False
        if mode == "strided":
            wide = np.full(x.shape[:-1] + (2 * x.shape[-1],), np.nan, dtype=x.dtype)
            return wide[..., 1::2], False
        if mode == "in-place":
            return x, True
        return None, False

    def positions(self, shape: tuple[int, ...]) -> Array:
        """Return integer or real positions of `shape`, small or large."""
        size = self.pick(("small", "small", "large", "real"), "positions")
        if size == "small":
            return self.rng.integers(0, 200, shape)
        if size == "large":
            return self.rng.integers(0, 3_000_000, shape)
        return self.rng.uniform(0, 1000, shape)

    def offset(self) -> float:
        """Return 0, a small, a large or a fractional offset."""
        return float(self.pick((0, 7, 1_000_003, 2.5), "offset"))


def row_scale(x: Array) -> Array:
    """Magnitude of each row of `x` (largest |entry| of the last axis), keepdims."""
    if x.size == 0:
        return np.ones(x.shape[:-1] + (1,))
    return np.asarray(np.max(np.abs(x.astype(np.float64)), axis=-1, keepdims=True))
