"""The pure-Python reference: plain loops, ``math``, float64.

Every kernel of posenc_fast is tested against these functions.  They are
written to be read, not to be fast, and take no shortcuts: each value is
computed from its definition (an angle: the cos/sin of the exact product
of position and frequency, `cos_sin_of`).  Results are returned as float64
NumPy arrays (NumPy is used only to hold them); `round_once` rounds them to
a half type.
"""

import math

import ml_dtypes
import numpy as np


# ---------------------------------------------------------------------------
# what each function takes: the library's rules, so that no input gives a silent answer


def _need(condition, message):
    if not condition:
        raise ValueError(message)


def _one_of(value, name, options):
    _need(value in options, f"{name} must be one of {options}, got {value!r}")


def _integers(values, name):
    values = np.asarray(values)
    _need(values.dtype.kind in "iu", f"{name} must be integers, got dtype {values.dtype}")
    return values


# ---------------------------------------------------------------------------
# angles


def _two_pi_scaled(bits, guard=64):
    """floor(2*pi * 2**bits), by Machin's formula (pi/4 = 4 atan(1/5) - atan(1/239)) in integers."""
    def arctan_inverse(x, one):  # atan(1/x) * one
        total = term = one // x
        n, sign = 1, 1
        while term:
            term //= x * x
            n, sign = n + 2, -sign
            total += sign * (term // n)
        return total
    one = 1 << (bits + guard)
    return (8 * (4 * arctan_inverse(5, one) - arctan_inverse(239, one))) >> guard


_PI_BITS = 1200  # past every finite float64 product's exponent (1024) and its 53 bits, with margin
_TWO_PI = _two_pi_scaled(_PI_BITS)


def cos_sin_of(position, frequency):
    """cos and sin of the exact product ``position * frequency`` of two float64 values (not of its
    rounding: the kernels' angle): reduced modulo 2*pi in integers, then libm's cos and sin of the
    reduced angle rounded once.  ValueError where the rounded product is not finite."""
    position, frequency = float(position), float(frequency)
    rounded = position * frequency
    if not math.isfinite(rounded):
        raise ValueError(f"the angle {position!r} * {frequency!r} is not finite")
    if abs(rounded) <= 3.0:  # below pi: no turn to take off, the rounded product is the reduced angle
        return math.cos(rounded), math.sin(rounded)
    pn, pd = position.as_integer_ratio()
    fn, fd = frequency.as_integer_ratio()
    n, d = pn * fn, pd * fd  # the exact product n / d
    bits = math.frexp(rounded)[1] + 128
    two_pi = _TWO_PI >> (_PI_BITS - bits)  # 2*pi * 2**bits
    turns = ((n << (bits + 1)) + two_pi * d) // (2 * two_pi * d)  # round(n / d / (2*pi))
    angle = ((n << bits) - turns * two_pi * d) / (d << bits)  # int / int: rounded once
    return math.cos(angle), math.sin(angle)


# ---------------------------------------------------------------------------
# sinusoidal encodings


def sinusoidal_frequency(i, dim, base=10000.0):
    """w_i = base ** (-2*i/dim), the frequency of column pair i."""
    return base ** (-2 * i / dim)


def sinusoidal_row(position, dim, base=10000.0, layout="interleaved"):
    """The encoding of one position as a list of `dim` floats."""
    _need(dim >= 0, f"dim must be >= 0, got {dim}")
    _one_of(layout, "layout", ("interleaved", "split"))
    num_sin = (dim + 1) // 2  # an odd dim has one more sin column than cos columns
    num_cos = dim // 2
    cos_sin = [cos_sin_of(position, sinusoidal_frequency(i, dim, base)) for i in range(num_sin)]
    sines, cosines = [s for _, s in cos_sin], [c for c, _ in cos_sin[:num_cos]]
    if layout == "split":
        return sines + cosines
    row = []
    for i in range(num_sin):
        row.append(sines[i])
        if i < num_cos:
            row.append(cosines[i])
    return row


def sinusoidal_table(length, dim, *, offset=0, base=10000.0, layout="interleaved"):
    """Rows for positions offset, offset+1, ..., offset+length-1."""
    _need(length >= 0, f"length must be >= 0, got {length}")
    rows = [sinusoidal_row(offset + p, dim, base, layout) for p in range(length)]
    return np.array(rows, dtype=np.float64).reshape(length, dim)


def sinusoidal(positions, dim, *, base=10000.0, layout="interleaved"):
    """The encoding of every position of an array: shape positions.shape + (dim,)."""
    positions = np.asarray(positions, dtype=np.float64)
    result = np.zeros(positions.shape + (dim,))
    for index in np.ndindex(positions.shape):
        result[index] = sinusoidal_row(float(positions[index]), dim, base, layout)
    return result


def add_sinusoidal(x, *, positions=None, offset=0, base=10000.0):
    """x + PE, row by row: row (..., s, :) gets the encoding of positions[..., s]."""
    x = np.asarray(x, dtype=np.float64)
    _need(x.ndim >= 2, f"x must have shape (..., seq, dim), got {x.shape}")
    dim = x.shape[-1]
    if positions is None:
        positions = np.arange(x.shape[-2])
    positions = np.broadcast_to(np.asarray(positions, dtype=np.float64), x.shape[:-1])
    result = x.copy()
    for index in np.ndindex(x.shape[:-1]):
        row = sinusoidal_row(float(positions[index]) + offset, dim, base)
        for j in range(dim):
            result[index + (j,)] = x[index + (j,)] + row[j]
    return result


# ---------------------------------------------------------------------------
# learned absolute positions


def add_position_table(x, table, positions=None, *, offset=0):
    """x + table[position] for every row of x (..., seq, dim)."""
    x = np.asarray(x, dtype=np.float64)
    table = np.asarray(table, dtype=np.float64)
    _need(x.ndim >= 2 and table.ndim == 2 and table.shape[1] == x.shape[-1],
          f"x (..., seq, dim) and table (n, dim) must end in the same dim, got {x.shape} and {table.shape}")
    if positions is None:
        positions = np.arange(x.shape[-2])
    positions = np.broadcast_to(_integers(positions, "positions"), x.shape[:-1])
    result = x.copy()
    for index in np.ndindex(x.shape[:-1]):
        p = int(positions[index]) + offset
        if not 0 <= p < table.shape[0]:
            raise ValueError(f"position {p} outside [0, {table.shape[0]})")
        for j in range(x.shape[-1]):
            result[index + (j,)] = x[index + (j,)] + table[p, j]
    return result


# ---------------------------------------------------------------------------
# rotary position embedding


def rope_inv_freq(rotary_dim, base=10000.0):
    """inv_freq[i] = base ** (-2*i/rotary_dim) for i < rotary_dim/2."""
    return [base ** (-2 * i / rotary_dim) for i in range(rotary_dim // 2)]


def axial_pairs(rotary_dim, n_axes, base=10000.0, axis_order=None, pairs="blocks",
                frequencies="shared"):
    """Each pair's frequency and axis of an axial RoPE (``RotaryEmbedding.axial``): two lists.

    Every axis takes rotary_dim / (2 n_axes) pairs, a block; block b (of axis
    axis_order[b]) takes the frequencies of a rotary_dim / n_axes RoPE
    ("shared") or every n_axes-th of the rotary_dim RoPE's from the b-th
    ("split"); the blocks follow one another ("blocks") or take turns pair
    by pair ("alternating").
    """
    _one_of(pairs, "pairs", ("blocks", "alternating"))
    _one_of(frequencies, "frequencies", ("shared", "split"))
    order = list(range(n_axes)) if axis_order is None else list(axis_order)
    if frequencies == "shared":
        block_freqs = [rope_inv_freq(rotary_dim // n_axes, base) for _ in range(n_axes)]
    else:
        block_freqs = [rope_inv_freq(rotary_dim, base)[b::n_axes] for b in range(n_axes)]
    blocks = [[(freq, order[b]) for freq in block_freqs[b]] for b in range(n_axes)]
    if pairs == "blocks":
        chosen = [pair for block in blocks for pair in block]
    else:
        chosen = [pair for turn in zip(*blocks) for pair in turn]
    return [freq for freq, _ in chosen], [axis for _, axis in chosen]


def rope_pair_indices(i, rotary_dim, layout, rotary_start=0):
    """The two features that form pair i (of the rotary_dim features from rotary_start)."""
    _one_of(layout, "layout", ("interleaved", "half"))
    if layout == "interleaved":
        return rotary_start + 2 * i, rotary_start + 2 * i + 1
    return rotary_start + i, rotary_start + i + rotary_dim // 2


def rotate_vector(vector, position, inv_freq, layout="interleaved", attention_factor=1.0,
                  inverse=False, rotary_start=0):
    """Rotate one vector: pair i by position * inv_freq[i], then scale.

    Features [rotary_start, rotary_start + 2*len(inv_freq)) rotate, the
    others are copied unchanged.  `inverse` rotates
    by the negative angle and divides by the attention factor.  `position`
    may also be a sequence: one position per pair (several position streams).
    """
    result = [float(value) for value in vector]
    rotary_dim = 2 * len(inv_freq)
    _need(0 <= rotary_start and rotary_start + rotary_dim <= len(result),
          f"rotary_start + 2 * len(inv_freq) = {rotary_start} + {rotary_dim} must be <= the vector's "
          f"{len(result)} features")
    for i, frequency in enumerate(inv_freq):
        cos, sin = cos_sin_of(position[i] if isinstance(position, (list, tuple)) else position, frequency)
        if inverse:
            cos, sin = cos / attention_factor, -sin / attention_factor
        else:
            cos, sin = cos * attention_factor, sin * attention_factor
        first, second = rope_pair_indices(i, rotary_dim, layout, rotary_start)
        a, b = result[first], result[second]
        result[first] = a * cos - b * sin
        result[second] = a * sin + b * cos
    return result


def apply_rotary(x, positions, inv_freq, *, layout="interleaved", attention_factor=1.0,
                 inverse=False, rotary_start=0):
    """Rotate every vector x[..., :] by its position (positions broadcast to x.shape[:-1])."""
    x = np.asarray(x, dtype=np.float64)
    positions = np.broadcast_to(np.asarray(positions, dtype=np.float64), x.shape[:-1])
    result = np.zeros(x.shape)
    for index in np.ndindex(x.shape[:-1]):
        result[index] = rotate_vector(x[index], float(positions[index]), inv_freq, layout,
                                      attention_factor, inverse, rotary_start)
    return result


def apply_rotary_streams(x, positions, inv_freq, pair_streams, *, layout="half",
                         attention_factor=1.0, inverse=False, rotary_start=0):
    """Rotate every vector of x, pair i by the position of stream pair_streams[i]; with two rows
    of streams, pair i's first feature as rotated by stream pair_streams[0][i]'s position, its
    second as by pair_streams[1][i]'s.

    positions: (n_streams,) + a shape broadcasting to x.shape[:-1].
    """
    x = np.asarray(x, dtype=np.float64)
    positions = np.asarray(positions, dtype=np.float64)
    streams = [np.broadcast_to(p, x.shape[:-1]) for p in positions]
    rows = [list(pair_streams)] if np.ndim(pair_streams) == 1 else [list(row) for row in pair_streams]
    _need(all(0 <= stream < len(streams) for row in rows for stream in row),
          f"pair_streams must name rows of positions' {len(streams)} streams, got {rows}")
    result = np.zeros(x.shape)
    for index in np.ndindex(x.shape[:-1]):
        rotated = [rotate_vector(x[index], [float(streams[row[i]][index]) for i in range(len(inv_freq))],
                                 inv_freq, layout, attention_factor, inverse, rotary_start) for row in rows]
        result[index] = rotated[0]
        for i in range(len(inv_freq)) if len(rows) == 2 else ():  # the second features by their own row
            second = rope_pair_indices(i, 2 * len(inv_freq), layout, rotary_start)[1]
            result[index][second] = rotated[1][second]
    return result


def rope_cos_sin(positions, inv_freq, attention_factor=1.0):
    """cos and sin of position * inv_freq[i], times the attention factor."""
    positions = np.asarray(positions, dtype=np.float64)
    cos = np.zeros(positions.shape + (len(inv_freq),))
    sin = np.zeros(positions.shape + (len(inv_freq),))
    for index in np.ndindex(positions.shape):
        for i, frequency in enumerate(inv_freq):
            c, s = cos_sin_of(positions[index], frequency)
            cos[index + (i,)], sin[index + (i,)] = c * attention_factor, s * attention_factor
    return cos, sin


# ---------------------------------------------------------------------------
# rotation with a caller's cos/sin cache


def rotate_vector_cos_sin(vector, cos, sin, layout="half", inverse=False, rotary_start=0):
    """Rotate one vector with given cos/sin values, one per pair.

    Pair i is rotated as (a, b) -> (a*cos[i] - b*sin[i], a*sin[i] + b*cos[i]);
    `inverse` uses -sin.  Features outside [rotary_start, rotary_start +
    2*len(cos)) are copied unchanged.
    """
    result = [float(value) for value in vector]
    rotary_dim = 2 * len(cos)
    _need(len(sin) == len(cos) and 0 <= rotary_start and rotary_start + rotary_dim <= len(result),
          f"rotary_start + 2 * len(cos) = {rotary_start} + {rotary_dim} must be <= the vector's {len(result)} "
          f"features, sin as long as cos")
    for i in range(len(cos)):
        c, s = float(cos[i]), float(sin[i])
        if inverse:
            s = -s
        first, second = rope_pair_indices(i, rotary_dim, layout, rotary_start)
        a, b = result[first], result[second]
        result[first] = a * c - b * s
        result[second] = a * s + b * c
    return result


def apply_rotary_cos_sin(x, cos, sin, positions=None, *, layout="half", inverse=False,
                         rotary_start=0):
    """Rotate every vector of x with a cos/sin cache.

    Without `positions`, cos/sin (..., r/2) broadcast against
    x.shape[:-1] + (r/2,); with `positions`, they are tables (n, r/2) and
    vector x[idx] uses row positions[idx] (positions broadcast to x.shape[:-1]).
    """
    x = np.asarray(x, dtype=np.float64)
    cos = np.asarray(cos, dtype=np.float64)
    sin = np.asarray(sin, dtype=np.float64)
    lead, half = x.shape[:-1], cos.shape[-1]
    if positions is None:
        cos_rows = np.broadcast_to(cos, lead + (half,))
        sin_rows = np.broadcast_to(sin, lead + (half,))
    else:
        positions = np.broadcast_to(_integers(positions, "positions"), lead)
    result = np.zeros(x.shape)
    for index in np.ndindex(lead):
        if positions is None:
            c, s = cos_rows[index], sin_rows[index]
        else:
            p = int(positions[index])
            if not 0 <= p < cos.shape[0]:
                raise ValueError(f"position {p} outside [0, {cos.shape[0]})")
            c, s = cos[p], sin[p]
        result[index] = rotate_vector_cos_sin(x[index], c, s, layout, inverse, rotary_start)
    return result


# ---------------------------------------------------------------------------
# relative schemes
#
# Query i sits at position offset + i, key j at position j; k_len defaults to
# offset + q_len.


def alibi_slopes(num_heads):
    """2**(-8*(h+1)/n) for the largest power of two n <= num_heads, then every other slope of 2n."""
    _need(num_heads >= 1, f"num_heads must be >= 1, got {num_heads}")
    closest = 1
    while 2 * closest <= num_heads:
        closest *= 2
    slopes = [2.0 ** (-8 * (h + 1) / closest) for h in range(closest)]
    every_other_of_double = [2.0 ** (-8 * (h + 1) / (2 * closest)) for h in range(0, 2 * closest, 2)]
    slopes += every_other_of_double[:num_heads - closest]
    return np.array(slopes)


def alibi_bias(num_heads, q_len, k_len=None, *, offset=0, causal=True):
    """bias[h, i, j] = -slope_h * (q_pos - k_pos), or -slope_h * |q_pos - k_pos| if not causal.

    Written as slope * (k_pos - q_pos) and slope * -|q_pos - k_pos|: the same
    numbers, with +0.0 rather than -0.0 on the diagonal.
    """
    if k_len is None:
        k_len = offset + q_len
    _need(q_len >= 0 and k_len >= 0, f"q_len and k_len (offset + q_len by default) must be >= 0, got {q_len}, "
                                     f"{k_len}")
    slopes = alibi_slopes(num_heads)
    result = np.zeros((num_heads, q_len, k_len))
    for h in range(num_heads):
        for i in range(q_len):
            for j in range(k_len):
                q_pos, k_pos = offset + i, j
                distance = k_pos - q_pos if causal else -abs(q_pos - k_pos)
                result[h, i, j] = float(slopes[h]) * distance
    return result


def add_alibi(scores, *, offset=0, causal=True):
    """scores (..., heads, q_len, k_len) plus the ALiBi bias of its head count, in float64."""
    scores = np.asarray(scores, dtype=np.float64)
    _need(scores.ndim >= 3, f"scores must have shape (..., heads, q_len, k_len), got {scores.shape}")
    heads, q_len, k_len = scores.shape[-3:]
    bias = alibi_bias(heads, q_len, k_len, offset=offset, causal=causal) if heads else None
    result = scores.copy()
    for index in np.ndindex(scores.shape):
        h, i, j = index[-3:]
        result[index] = float(scores[index]) + float(bias[h, i, j])
    return result


def relative_position_index(q_len, k_len=None, *, max_distance, offset=0):
    """clip(k_pos - q_pos, -max_distance, max_distance) + max_distance, as int64."""
    _need(max_distance >= 0, f"max_distance must be >= 0, got {max_distance}")
    if k_len is None:
        k_len = offset + q_len
    result = np.zeros((q_len, k_len), dtype=np.int64)
    for i in range(q_len):
        for j in range(k_len):
            distance = j - (offset + i)
            result[i, j] = min(max(distance, -max_distance), max_distance) + max_distance
    return result


def _float32(value):
    return float(np.float32(value))


def t5_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """T5's bucket of one relative position (k_pos - q_pos), as transformers computes it.

    transformers' T5Attention._relative_position_bucket does the logarithmic
    part in float32 (torch tensors): every step below is rounded to float32
    the same way (the logarithm is libm's float32 log, which equals the
    float64 log rounded to float32 on every input the tests use).
    """
    _need(num_buckets >= (4 if bidirectional else 2), f"num_buckets must be >= 4 (bidirectional) or 2, got "
                                                      f"{num_buckets}")
    _need(max_distance > (num_buckets // 2 if bidirectional else num_buckets) // 2,
          f"max_distance must be > the exact buckets' count, got {max_distance}")
    bucket = 0
    n = num_buckets
    if bidirectional:
        n //= 2
        if relative_position > 0:
            bucket += n
        distance = abs(relative_position)
    else:
        distance = max(-relative_position, 0)
    max_exact = n // 2
    if distance < max_exact:
        return bucket + distance
    ratio = _float32(_float32(distance) / _float32(max_exact))
    scaled = _float32(_float32(math.log(ratio)) / _float32(math.log(max_distance / max_exact)))
    scaled = _float32(scaled * _float32(n - max_exact))
    return bucket + min(max_exact + int(scaled), n - 1)


def t5_relative_bucket(q_len, k_len=None, *, bidirectional=True, num_buckets=32,
                       max_distance=128, offset=0):
    """The T5 bucket of k_pos - q_pos for every (query, key), as int64."""
    if k_len is None:
        k_len = offset + q_len
    result = np.zeros((q_len, k_len), dtype=np.int64)
    for i in range(q_len):
        for j in range(k_len):
            result[i, j] = t5_bucket(j - (offset + i), bidirectional, num_buckets, max_distance)
    return result


# ---------------------------------------------------------------------------
# half precision

def round_once(values, dtype):
    """float64 `values` rounded once, to nearest (ties to even), to `dtype`.

    For float16 and bfloat16 each value is compared with its neighbours in
    the target type (a conversion through float32 could round twice).
    """
    dtype = np.dtype(dtype)
    values = np.asarray(values, dtype=np.float64)
    if dtype not in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        return values.astype(dtype)
    with np.errstate(over="ignore"):
        return _round_to_half_type(values, dtype)


def _round_to_half_type(values, dtype):
    result = np.empty(values.shape, dtype)
    flat, out = values.reshape(-1), result.reshape(-1)
    info = ml_dtypes.finfo(dtype)
    for k, value in enumerate(flat):
        if math.isnan(value):
            out[k] = np.nan
            continue
        guess = np.array(value).astype(np.float32).astype(dtype)
        candidates = [guess, np.nextafter(guess, np.array(np.inf, dtype), dtype=dtype)
                      if dtype == np.float16 else _bf16_step(guess, +1),
                      np.nextafter(guess, np.array(-np.inf, dtype), dtype=dtype)
                      if dtype == np.float16 else _bf16_step(guess, -1)]
        best = None
        for c in candidates:
            c64 = float(c)
            if math.isinf(c64) and abs(value) < float(info.max):
                continue
            key = (abs(c64 - value), int(np.array(c).view(np.uint16)) & 1)
            if best is None or key < best[0]:
                best = (key, c)
        if abs(value) >= float(info.max) + float(info.eps) * 2.0 ** (info.maxexp - 2):
            out[k] = math.copysign(math.inf, value)  # past max + half an ulp: overflow
        else:
            out[k] = best[1]
    return result


def _bf16_step(value, direction):
    # The bfloat16 next to `value` (finite) away from or toward +inf.
    bits = np.array(value).view(np.uint16).astype(np.int32)
    negative = bits >= 0x8000
    step = direction if not negative else -direction
    if bits & 0x7FFF == 0 and direction < 0 and not negative:
        return np.array(0x8001, np.uint16).view(ml_dtypes.bfloat16)
    return np.array((bits + step) & 0xFFFF, np.uint16).view(ml_dtypes.bfloat16)

