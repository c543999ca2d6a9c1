"""The data types of the kernels, for the templates of this folder (see setup.py).

setup.py renders every ``*.tp`` here with Tempita, with the names of this
file as the template's namespace.
"""

from typing import NamedTuple


class DType(NamedTuple):
    """One data type of the kernels (a row of `DTYPES`)."""

    suffix: str  # of every kernel's name and of its enum constant: posenc_add_f32, POSENC_F32
    storage: str  # the C type of an element in memory
    typenum: str  # its NumPy type number (a C expression: bfloat16's is set at run time)
    vectors: bool  # explicit vector kernels (posenc_vec_<suffix>) for rows of this type alone
    arith: str  # the C type its arithmetic runs in (float for a half type)


# The data types of the kernels.  A row here adds the dtype to every kernel,
# to the table and to its dispatch; a storage type other than its arithmetic
# type (a half type) also needs its conversions in posenc_half.h.
DTYPES = [
    DType("f32", "float", "NPY_FLOAT32", True, "float"),
    DType("f64", "double", "NPY_FLOAT64", True, "double"),
    DType("f16", "posenc_f16", "NPY_FLOAT16", False, "float"),
    DType("bf16", "posenc_bf16", "posenc_bf16_typenum", False, "float"),
]
HALF = tuple(d.suffix for d in DTYPES if d.storage != d.arith)
# (data, table) pairs of the table-add rows: every combination.  A half
# type computes in float: a float64 table value is rounded to float first.
PAIRS = [(d, t) for d in DTYPES for t in DTYPES]
# The rotation rows: float32/float64 with either; a half type with a float32
# table or one of its own type (cos/sin in float32 from the canonical values).
ROTATION_PAIRS = [(d, t) for d, t in PAIRS
                  if (d.suffix not in HALF and t.suffix not in HALF)
                  or t.suffix in ("f32", d.suffix)]
# The kinds of rotation row (the table's rotate[data][table][kind]): kernel
# posenc_<kind>_<data>_<table> each.
KINDS = ["HALF", "HALF_IN_PLACE", "HALF_VEC", "HALF_IN_PLACE_VEC", "INTERLEAVED",
         "HALF_STREAM", "INTERLEAVED_STREAM"]
# The kinds of the rows of one position (rotate_position, posenc_position.h):
# kernel posenc_position_<kind>_<data>_<table> each.
POSITION_KINDS = ["HALF", "HALF_IN_PLACE", "INTERLEAVED"]
LANES = [2, 4, 8, 16]


def table_arith(d, t):
    # The type a table value is loaded as: float for a half data type.
    return "float" if d.suffix in HALF else t.arith


def _kernel_names(prefix, kinds, d, t, separator):
    if (d, t) not in ROTATION_PAIRS:
        return ", ".join(["NULL"] * len(kinds))
    return separator.join("%s%s_%s_%s" % (prefix, kind.lower(), d.suffix, t.suffix)
                          for kind in kinds)


def rotation_names(d, t):
    return _kernel_names("posenc_", KINDS, d, t, ",\n              ")


def position_names(d, t):
    return _kernel_names("posenc_position_", POSITION_KINDS, d, t, ", ")


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
    return ", ".join(prefix + d.suffix + "_" + t.suffix for t in DTYPES)


def names(prefix):
    return ", ".join(prefix + d.suffix for d in DTYPES)


def converters(prefix):
    return ", ".join(prefix + d.suffix if d.suffix in HALF else "NULL" for d in DTYPES)
