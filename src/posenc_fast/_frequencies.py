"""RoPE frequency layer: inverse frequencies and attention factors of every scaling method.

Everything here is float64 NumPy / ``math``. The formulas mirror Hugging Face
transformers' ``modeling_rope_utils`` term by term (transformers evaluates them
in float32; these values are the float64 originals that its float32 results
round from), plus the static NTK-aware variant ``"ntk"`` that transformers
does not ship.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping

import numpy as np

from . import _validate as v

__all__ = ["RopeFrequencies", "resolve_rope_scaling", "ROPE_TYPES"]

#: Canonical method names, and the parameters each accepts.
ROPE_TYPES: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "ntk": frozenset({"factor"}),
    "dynamic": frozenset({"factor", "original_max_position_embeddings"}),
    "yarn": frozenset(
        {
            "factor",
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "attention_factor",
            "truncate",
        }
    ),
    "llama3": frozenset(
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
    ),
    "longrope": frozenset(
        {"short_factor", "long_factor", "original_max_position_embeddings", "factor", "attention_factor"}
    ),
    "proportional": frozenset({"factor", "partial_rotary_factor"}),
}

_ALIASES = {"su": "longrope"}


# --------------------------------------------------------------------------- scaling entries
# A scaling dict's entries are checked by the rules of _validate; a bad entry
# is a ValueError (the dict is one argument, of the right type).


def _entry(check, value, key: str, rope_type: str, **rule):
    """Apply the _validate rule `check` to the entry `value` of `key`."""
    try:
        return check(value, f"scaling[{key!r}] (rope_type {rope_type!r})", **rule)
    except TypeError as error:
        raise ValueError(str(error)) from None


def _required(params: Mapping, key: str, rope_type: str) -> None:
    if params.get(key) is None:
        raise ValueError(f"scaling for rope_type {rope_type!r} needs parameter {key!r}, which is missing")


def _real(params: Mapping, key: str, rope_type: str, *, default=None, **rule) -> float | None:
    """``params[key]`` as a finite float (`default` when absent or None)."""
    value = params.get(key)
    return default if value is None else _entry(v.real, value, key, rope_type, **rule)


def _factor(params: Mapping, rope_type: str) -> float:
    _required(params, "factor", rope_type)
    return _real(params, "factor", rope_type, minimum=1.0)


def _original_length(params: Mapping, rope_type: str) -> int:
    key = "original_max_position_embeddings"
    _required(params, key, rope_type)
    return _entry(v.whole_number, params[key], key, rope_type, minimum=1)


def _factor_list(params: Mapping, key: str, rope_type: str, rotary_dim: int) -> np.ndarray:
    _required(params, key, rope_type)
    return _entry(v.positive_reals, params[key], key, rope_type, length=rotary_dim // 2,
                  length_name="rotary_dim // 2")


# --------------------------------------------------------------------------- formulas


def _base_powers(base: float, exponent_sign: int, rotary_dim: int) -> np.ndarray:
    """``base ** (sign * 2i / rotary_dim)`` for each pair i, by libm's pow.

    Python's float pow is libm's (as in ``reference.py``); NumPy's SIMD power
    may differ from it by an ulp.
    """
    # Allocated first: an impossible rotary_dim fails at once, not after a long loop.
    powers = v.empty(rotary_dim // 2, np.float64, f"rotary_dim = {rotary_dim}")
    for i in range(powers.size):
        powers[i] = base ** (exponent_sign * 2 * i / rotary_dim)
    return powers


def _default_inv_freq(base: float, rotary_dim: int) -> np.ndarray:
    """``base ** (-2i / rotary_dim)``: HF's ``1 / base ** (2i/d)`` to float32 rounding."""
    return _base_powers(base, -1, rotary_dim)


def _get_mscale(scale: float, mscale: float = 1.0) -> float:
    # YaRN's attention temperature, HF ``_compute_yarn_parameters.get_mscale``
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn(base: float, rotary_dim: int, p: dict) -> tuple[np.ndarray, float]:
    factor = p["factor"]
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        # HF tests truthiness, so an mscale of 0 means "absent"
        if mscale and mscale_all_dim:
            attention_factor = float(_get_mscale(factor, mscale) / _get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = _get_mscale(factor)

    dim = rotary_dim
    original = p["original_max_position_embeddings"]

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = correction_dim(p["beta_fast"])
    high = correction_dim(p["beta_slow"])
    if p["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp

    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation_weight = 1.0 - ramp
    pos_freqs = _base_powers(base, 1, dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    inv_freq = (
        inv_freq_interpolation * (1.0 - extrapolation_weight)
        + inv_freq_extrapolation * extrapolation_weight
    )
    return inv_freq, float(attention_factor)


def _llama3(base: float, rotary_dim: int, p: dict) -> np.ndarray:
    inv_freq = _default_inv_freq(base, rotary_dim)
    factor = p["factor"]
    low_freq_factor, high_freq_factor = p["low_freq_factor"], p["high_freq_factor"]
    old_context_len = p["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor

    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    with np.errstate(divide="ignore", invalid="ignore"):
        # equal factors (Llama 4 Scout): no medium band, unless a wavelength equals the bound (0/0, as in HF)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, inv_freq_llama)


def _longrope_attention(p: dict) -> float:
    attention_factor = p.get("attention_factor")
    if attention_factor is not None:
        return attention_factor
    factor = p.get("factor", 1.0)
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(p["original_max_position_embeddings"]))


def _longrope_inv_freq(base: float, rotary_dim: int, ext_factors: np.ndarray) -> np.ndarray:
    return 1.0 / (ext_factors * _base_powers(base, 1, rotary_dim))


def _dynamic_base(base: float, rotary_dim: int, factor: float, original: int, seq_len: int) -> float:
    """HF ``_compute_dynamic_ntk_parameters``: the base a fresh module uses for ``seq_len``
    (OverflowError where it is not a finite float64: ``factor * seq_len`` may overflow to inf
    without raising)."""
    seq_len = max(seq_len, original)
    grown = base * ((factor * seq_len / original) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
    if not math.isfinite(grown):
        raise OverflowError(f"dynamic NTK base {grown}")
    return grown


# --------------------------------------------------------------------------- normalisation


def _normalise(scaling: Mapping, rotary_dim: int, base: float) -> tuple[str, dict]:
    """Validate ``scaling`` and return (canonical rope_type, normalised parameter dict)."""
    raw_type = scaling.get("rope_type", scaling.get("type"))
    if raw_type is None:
        raise ValueError(
            f"scaling needs 'rope_type' (or legacy 'type') naming the method, one of "
            f"{sorted(ROPE_TYPES)}; got keys {sorted(scaling)}"
        )
    if not isinstance(raw_type, str):
        raise ValueError(f"scaling['rope_type'] must be a str, got {type(raw_type).__name__} ({raw_type!r})")
    rope_type = _ALIASES.get(raw_type, raw_type)
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"scaling['rope_type'] must be one of {sorted(ROPE_TYPES) + sorted(_ALIASES)}, got {raw_type!r}"
        )

    allowed = ROPE_TYPES[rope_type] | {"rope_type", "type", "rope_theta"}
    unknown = sorted(set(scaling) - allowed)
    if unknown:
        raise ValueError(
            f"scaling for rope_type {rope_type!r} got unknown parameter(s) {unknown}; "
            f"expected some of {sorted(ROPE_TYPES[rope_type])}"
        )
    theta = scaling.get("rope_theta")
    if theta is not None and not (isinstance(theta, numbers.Real) and float(theta) == base):
        raise ValueError(f"scaling['rope_theta'] = {theta!r} disagrees with base = {base!r}")

    p: dict = {"rope_type": rope_type}
    if rope_type in ("linear", "ntk", "dynamic", "yarn", "llama3"):
        p["factor"] = _factor(scaling, rope_type)
    if rope_type in ("ntk", "dynamic") and rotary_dim < 4:
        raise ValueError(f"rope_type {rope_type!r} needs rotary_dim >= 4 (it divides by rotary_dim - 2), got {rotary_dim}")
    if rope_type in ("dynamic", "yarn", "llama3", "longrope"):
        p["original_max_position_embeddings"] = _original_length(scaling, rope_type)

    if rope_type == "yarn":
        # HF reads beta_fast/beta_slow as `value or default`
        p["beta_fast"] = _real(scaling, "beta_fast", rope_type, positive=True, default=32.0)
        p["beta_slow"] = _real(scaling, "beta_slow", rope_type, positive=True, default=1.0)
        if p["beta_fast"] < p["beta_slow"]:
            raise ValueError(
                f"scaling['beta_fast'] must be >= scaling['beta_slow'] (rope_type 'yarn'), got "
                f"beta_fast={p['beta_fast']!r} and beta_slow={p['beta_slow']!r}"
            )
        for key in ("mscale", "mscale_all_dim"):
            value = _real(scaling, key, rope_type)
            if value is not None:
                p[key] = value
        p["truncate"] = _entry(v.flag, scaling.get("truncate", True), "truncate", rope_type)

    if rope_type in ("yarn", "longrope"):
        attention_factor = _real(scaling, "attention_factor", rope_type, positive=True)
        if attention_factor is not None:
            p["attention_factor"] = attention_factor

    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            _required(scaling, key, rope_type)
            p[key] = _real(scaling, key, rope_type, positive=True)
        if not p["low_freq_factor"] <= p["high_freq_factor"]:
            raise ValueError(
                "scaling['low_freq_factor'] must be <= scaling['high_freq_factor'] (rope_type 'llama3'), got "
                f"low_freq_factor={p['low_freq_factor']!r} and high_freq_factor={p['high_freq_factor']!r}"
            )

    if rope_type == "proportional":
        p["factor"] = _real(scaling, "factor", rope_type, positive=True, default=1.0)
        p["partial_rotary_factor"] = _real(scaling, "partial_rotary_factor", rope_type, minimum=0.0, default=1.0)
        if p["partial_rotary_factor"] > 1.0:
            raise ValueError(f"scaling['partial_rotary_factor'] (rope_type 'proportional') must be <= 1, "
                             f"got {p['partial_rotary_factor']!r}")

    if rope_type == "longrope":
        p["short_factor"] = _factor_list(scaling, "short_factor", rope_type, rotary_dim).tolist()
        p["long_factor"] = _factor_list(scaling, "long_factor", rope_type, rotary_dim).tolist()
        factor = _real(scaling, "factor", rope_type, positive=True)
        if factor is not None:
            p["factor"] = factor
    return rope_type, p


# --------------------------------------------------------------------------- result


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array, dtype=np.float64)
    array.flags.writeable = False
    return array


class RopeFrequencies:
    """Resolved RoPE frequencies of one scaling method (immutable).

    Build it with :func:`resolve_rope_scaling`.

    Attributes
    ----------
    rope_type : str
        Canonical method name (``"default"``, ``"linear"``, ``"ntk"``,
        ``"dynamic"``, ``"yarn"``, ``"llama3"`` or ``"longrope"``).
    params : dict or None
        Normalised copy of the scaling dict (canonical ``"rope_type"``, floats,
        defaults filled in); None for no scaling. Each access returns a fresh copy.
    inv_freq : numpy.ndarray
        float64, shape ``(rotary_dim // 2,)``, read-only: the frequencies of
        calls that do not depend on length; for ``"dynamic"`` and
        ``"longrope"`` the frequencies of sequences no longer than the
        original length.
    attention_factor : float
        Factor applied to cos and sin (transformers' ``attention_scaling``).
    depends_on_length : bool
        True for ``"dynamic"`` and ``"longrope"``, whose frequencies depend on
        ``seq_len = max(positions) + 1`` of each call.
    """

    __slots__ = ("_rope_type", "_params", "_inv_freq", "_attention_factor", "_for_length", "_rotary_dim", "_base")

    def __init__(self, rope_type: str, params: dict | None, inv_freq: np.ndarray,
                 attention_factor: float, for_length, rotary_dim: int, base: float):
        setattr_ = object.__setattr__
        setattr_(self, "_rope_type", rope_type)
        setattr_(self, "_params", params)
        setattr_(self, "_inv_freq", _frozen(inv_freq))
        setattr_(self, "_attention_factor", float(attention_factor))
        setattr_(self, "_for_length", for_length)
        setattr_(self, "_rotary_dim", rotary_dim)
        setattr_(self, "_base", base)

    def __setattr__(self, name, value):
        raise AttributeError(f"RopeFrequencies is immutable (cannot set {name!r})")

    def __delattr__(self, name):
        raise AttributeError(f"RopeFrequencies is immutable (cannot delete {name!r})")

    @property
    def rope_type(self) -> str:
        return self._rope_type

    @property
    def params(self) -> dict | None:
        if self._params is None:
            return None
        return {k: list(v) if isinstance(v, list) else v for k, v in self._params.items()}

    @property
    def inv_freq(self) -> np.ndarray:
        return self._inv_freq

    @property
    def attention_factor(self) -> float:
        return self._attention_factor

    @property
    def depends_on_length(self) -> bool:
        return self._for_length is not None

    def inv_freq_for(self, seq_len: int) -> np.ndarray:
        """Frequencies used by a call whose ``seq_len = max(positions) + 1``.

        Parameters
        ----------
        seq_len : int
            Length of the call, >= 1. A float holding a whole number is accepted.

        Returns
        -------
        numpy.ndarray
            float64, shape ``(rotary_dim // 2,)``, read-only. The same array as
            :attr:`inv_freq` unless :attr:`depends_on_length` (``"dynamic"``
            beyond the original length, ``"longrope"`` once ``seq_len`` exceeds
            it). Results are cached.

        Raises
        ------
        TypeError
            If ``seq_len`` is not a number.
        ValueError
            If ``seq_len`` is not a whole number >= 1.
        """
        seq_len = v.whole_number(seq_len, "seq_len", minimum=1)
        if self._for_length is None:
            return self._inv_freq
        return self._for_length(seq_len)

    def attention_factor_for(self, seq_len: int) -> float:
        """Attention factor used by a call whose ``seq_len = max(positions) + 1``.

        No method implemented here makes it depend on ``seq_len`` (transformers'
        LongRoPE fixes it from ``factor``), so this validates ``seq_len`` and
        returns :attr:`attention_factor`.

        Parameters
        ----------
        seq_len : int
            Length of the call, >= 1.

        Returns
        -------
        float
        """
        v.whole_number(seq_len, "seq_len", minimum=1)
        return self._attention_factor

    def __repr__(self) -> str:
        return (
            f"RopeFrequencies(rope_type={self._rope_type!r}, rotary_dim={self._rotary_dim}, "
            f"base={self._base!r}, attention_factor={self._attention_factor!r}, params={self._params!r})"
        )


def _finite_or_value_error(function):
    """Turn arithmetic failures of the formulas (parameters that overflow
    float64, divide by zero or leave a logarithm's domain, e.g. ``base=1`` for
    YaRN) into ValueError, and refuse non-finite frequencies, and attention
    factors that are not positive with a finite reciprocal (the inverse
    rotation divides by it)."""

    @functools.wraps(function)
    def checked(scaling, *, rotary_dim, base):
        try:
            with np.errstate(all="ignore"):
                result = function(scaling, rotary_dim=rotary_dim, base=base)
        except (OverflowError, ZeroDivisionError, ValueError) as error:
            if type(error) is ValueError and str(error) != "math domain error":
                raise  # a parameter's own check, which names it
            raise ValueError(f"RoPE scaling {_short_repr(scaling)} with rotary_dim={rotary_dim!r}, "
                             f"base={_short_repr(base)} has no finite frequencies ({error})") from None
        if not np.isfinite(result.inv_freq).all():
            raise ValueError(f"RoPE scaling {_short_repr(scaling)} with rotary_dim={rotary_dim!r}, "
                             f"base={_short_repr(base)} gives non-finite frequencies")
        factor = result.attention_factor
        if not (math.isfinite(factor) and factor > 0 and math.isfinite(1.0 / factor)):
            raise ValueError(f"RoPE scaling {_short_repr(scaling)} gives the attention factor {factor!r}: it "
                             f"must be > 0 with a finite reciprocal (the inverse rotation divides by it); "
                             f"see its attention_factor, or mscale and mscale_all_dim (YaRN)")
        return result

    return checked


def _short_repr(value) -> str:
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 200 else "<huge int>"
    return text if len(text) <= 200 else text[:200] + "..."


@_finite_or_value_error
def resolve_rope_scaling(scaling, *, rotary_dim: int, base: float) -> RopeFrequencies:
    """Resolve a RoPE scaling description into frequencies and an attention factor.

    Parameters
    ----------
    scaling : Mapping or None
        None (plain RoPE) or a dict in Hugging Face's vocabulary: ``"rope_type"``
        (or legacy ``"type"``) names the method, one of ``"default"``,
        ``"linear"``, ``"ntk"``, ``"dynamic"``, ``"yarn"``, ``"llama3"``,
        ``"longrope"`` (alias ``"su"``); the other keys are that method's
        parameters (see the Notes below). The dict must be
        self-contained: ``original_max_position_embeddings`` is required by
        ``"dynamic"``, ``"yarn"``, ``"llama3"`` and ``"longrope"``. A
        ``"rope_theta"`` key is accepted when it equals ``base``.
    rotary_dim : int
        Number of rotated features, even and >= 2.
    base : float
        RoPE base (``rope_theta``), finite and > 0.

    Returns
    -------
    RopeFrequencies
        ``params`` is None when ``scaling`` is None or names ``"default"``.

    Raises
    ------
    TypeError
        If ``scaling`` is not a mapping or None, ``rotary_dim`` is not an int
        or ``base`` is not a real number.
    ValueError
        For an unknown method, an unknown, missing or invalid parameter
        (the message names it with the expected and actual value), an odd or
        too small ``rotary_dim``, or a non-finite or non-positive ``base``.

    Notes
    -----
    - ``"linear"``: ``inv_freq / factor`` (position interpolation).
    - ``"ntk"``: default frequencies of ``base * factor ** (d / (d - 2))``.
    - ``"dynamic"``: for ``seq_len`` beyond the original length ``L``, default
      frequencies of ``base * (factor * seq_len / L - (factor - 1)) ** (d / (d - 2))``;
      unchanged up to ``L``; stateless (as a fresh transformers module).
    - ``"yarn"``: transformers' ramp between interpolated and extrapolated
      frequencies; attention factor ``attention_factor`` if given, else
      ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are
      non-zero, else ``0.1 * ln(factor) + 1`` (1 for ``factor <= 1``).
    - ``"llama3"``: wavelength-dependent division by ``factor``.
    - ``"proportional"``: linear for the first ``int(partial_rotary_factor *
      rotary_dim // 2)`` pairs; the others do not rotate (frequency 0).
    - ``"longrope"``: ``1 / (ext * base ** (2i / d))`` with ``ext = long_factor``
      when ``seq_len > original_max_position_embeddings`` else
      ``short_factor``; attention factor ``attention_factor`` if given, else
      ``sqrt(1 + ln(factor) / ln(original))`` for ``factor > 1``, else 1
      (also when ``factor`` is absent).
    """
    rotary_dim = v.rotary_dim(rotary_dim)
    base = v.real(base, "base")
    if base <= 0:
        raise ValueError(f"base must be finite and > 0, got {base!r}")
    if v.mapping_or_none(scaling, "scaling") is None:
        return RopeFrequencies("default", None, _default_inv_freq(base, rotary_dim), 1.0, None, rotary_dim, base)

    rope_type, p = _normalise(scaling, rotary_dim, base)
    params = None if rope_type == "default" else p
    attention_factor = 1.0
    for_length = None

    if rope_type == "default":
        inv_freq = _default_inv_freq(base, rotary_dim)
    elif rope_type == "linear":
        inv_freq = _default_inv_freq(base, rotary_dim) / p["factor"]
    elif rope_type == "proportional":
        # HF _compute_proportional_rope_parameters: int(partial * rotary_dim // 2) default frequencies, then zeros
        inv_freq = _default_inv_freq(base, rotary_dim) / p["factor"]
        inv_freq[int(p["partial_rotary_factor"] * rotary_dim // 2):] = 0.0
    elif rope_type == "ntk":
        inv_freq = _default_inv_freq(base * p["factor"] ** (rotary_dim / (rotary_dim - 2)), rotary_dim)
    elif rope_type == "dynamic":
        inv_freq = _default_inv_freq(base, rotary_dim)
        short = _frozen(inv_freq)
        factor, original = p["factor"], p["original_max_position_embeddings"]

        @functools.lru_cache(maxsize=256)
        def grown(seq_len: int) -> np.ndarray:
            return _frozen(_default_inv_freq(_dynamic_base(base, rotary_dim, factor, original, seq_len), rotary_dim))

        def for_length(seq_len: int) -> np.ndarray:
            if seq_len <= original:
                return short
            try:
                with np.errstate(all="ignore"):
                    return grown(seq_len)
            except OverflowError:
                raise ValueError(f"dynamic NTK: the base for seq_len={_short_repr(seq_len)} "
                                 f"overflows float64 (positions too large)") from None

    elif rope_type == "yarn":
        inv_freq, attention_factor = _yarn(base, rotary_dim, p)
    elif rope_type == "llama3":
        inv_freq = _llama3(base, rotary_dim, p)
    else:  # longrope
        original = p["original_max_position_embeddings"]
        inv_freq = _longrope_inv_freq(base, rotary_dim, np.array(p["short_factor"]))
        short = _frozen(inv_freq)
        long = _frozen(_longrope_inv_freq(base, rotary_dim, np.array(p["long_factor"])))
        attention_factor = _longrope_attention(p)

        def for_length(seq_len: int) -> np.ndarray:
            return long if seq_len > original else short

    if for_length is not None:
        # the short-sequence array is the very object inv_freq_for returns
        return RopeFrequencies(rope_type, params, short, attention_factor, for_length, rotary_dim, base)
    return RopeFrequencies(rope_type, params, inv_freq, attention_factor, None, rotary_dim, base)
