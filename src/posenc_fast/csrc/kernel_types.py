"""The data types of the kernels, for the templates of this folder (see setup.py).

setup.py renders every ``*.tp`` here with Tempita, with the names of this
file as the template's namespace.
"""

# The data types of the kernels: (suffix, C storage type, NumPy type number,
# explicit vectors, arithmetic type).  A row here adds the dtype to every
# kernel, to the table and to its dispatch; a storage type other than its
# arithmetic type also needs its conversions in posenc_half.h.
DTYPES = [
    ("f32", "float", "NPY_FLOAT32", True, "float"),
    ("f64", "double", "NPY_FLOAT64", True, "double"),
    ("f16", "posenc_f16", "NPY_FLOAT16", False, "float"),
    ("bf16", "posenc_bf16", "posenc_bf16_typenum", False, "float"),
]
HALF = ("f16", "bf16")
# (data, table) pairs of the table-add rows: every combination.  A half
# type computes in float: a float64 table value is rounded to float first.
PAIRS = [(d, t) for d in DTYPES for t in DTYPES]
# The rotation rows: float32/float64 with either; a half type with a float32
# table or one of its own type (cos/sin in float32 from the canonical values).
ROTATION_PAIRS = [(d, t) for d, t in PAIRS
                  if (d[0] not in HALF and t[0] not in HALF) or t[0] in ("f32", d[0])]

def table_arith(d, t):
    # The type a table value is loaded as: float for a half data type.
    return "float" if d[0] in HALF else t[4]

def rotation_names(d, t):
    if (d, t) not in ROTATION_PAIRS:
        return ", ".join(["NULL"] * len(KINDS))
    sfx = d[0] + "_" + t[0]
    return ",\n              ".join(name % sfx for name in (
        "posenc_half_%s", "posenc_half_in_place_%s", "posenc_half_vec_%s",
        "posenc_half_in_place_vec_%s", "posenc_interleaved_%s", "posenc_half_stream_%s",
        "posenc_interleaved_stream_%s"))
# The kinds of the rows of one position (rotate_position, posenc_position.h).
POSITION_KINDS = ["HALF", "HALF_IN_PLACE", "INTERLEAVED"]

def position_names(d, t):
    if (d, t) not in ROTATION_PAIRS:
        return ", ".join(["NULL"] * len(POSITION_KINDS))
    return ", ".join("posenc_position_%s_%s_%s" % (kind.lower(), d[0], t[0])
                     for kind in POSITION_KINDS)
KINDS = ["HALF", "HALF_IN_PLACE", "HALF_VEC", "HALF_IN_PLACE_VEC", "INTERLEAVED",
         "HALF_STREAM", "INTERLEAVED_STREAM"]
LANES = [2, 4, 8, 16]

def mask(kind, lanes):
    # Lanes of the concatenation of two vectors: even/odd, or low/high halves interleaved.
    if kind == "EVEN":
        picks = [2 * i for i in range(lanes)]
    elif kind == "ODD":
        picks = [2 * i + 1 for i in range(lanes)]
    else:
        first = 0 if kind == "LOW" else lanes // 2
        picks = [first + i // 2 + (lanes if i % 2 else 0) for i in range(lanes)]
    return ", ".join(str(p) for p in picks)

def pair_names(prefix, d):
    return ", ".join(prefix + d[0] + "_" + t[0] for t in DTYPES)

def names(prefix):
    return ", ".join(prefix + d[0] for d in DTYPES)

def converters(prefix):
    return ", ".join(prefix + d[0] if d[0] in HALF else "NULL" for d in DTYPES)
