"""The data types of the kernels and the table of them, for the templates (see setup.py).

setup.py renders every ``*.tp`` here and ``../_kernel_table.pxd.tp`` with
Tempita, with the names of this file as the template's namespace: the enums,
the kernels' function types and the fields of ``posenc_kernel_table`` are
written here once, for posenc_kernels.h and for _core's declarations of it.
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
# type (a half type) also needs its conversions in posenc_half_types.h.
DTYPES = [
    DType("f32", "float", "NPY_FLOAT32", True, "float"),
    DType("f64", "double", "NPY_FLOAT64", True, "double"),
    DType("f16", "posenc_f16", "NPY_FLOAT16", False, "float"),
    DType("bf16", "posenc_bf16", "posenc_bf16_typenum", False, "float"),
]
HALF = tuple(d.suffix for d in DTYPES if d.storage != d.arith)
# (data, table) pairs of the table-add rows: every combination.  A half
# type adds in float, or in double with a float64 table (rounded once).
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
POSITION_KINDS = ["HALF", "HALF_IN_PLACE", "INTERLEAVED", "HALF_LINES"]
LANES = [2, 4, 8, 16]
# The pair counts of the model zoo's head sizes (64 to 256) that a block of rows in cache takes as
# constants (posenc_block_: no loop counts or remainder tests left to run), the commonest first.
PAIR_COUNTS = (64, 32, 40, 48, 50, 56, 80, 96, 128)

# The enums of posenc_kernels.h, each closed by its count.
DTYPE_ENUM = ["POSENC_" + d.suffix.upper() for d in DTYPES] + ["POSENC_NUM_DTYPES"]
ROW_KIND_ENUM = ["POSENC_ROW_" + kind for kind in KINDS] + ["POSENC_NUM_ROW_KINDS"]
POSITION_KIND_ENUM = (["POSENC_POSITION_" + kind for kind in POSITION_KINDS]
                      + ["POSENC_NUM_POSITION_KINDS"])


class FunctionType(NamedTuple):
    """A type of kernel in the table: ``<result> (*posenc_<name>_fn)(params)``."""

    name: str
    comment: tuple[str, ...]  # the lines of its C comment
    params: tuple[str, ...]  # its parameters, as the lines they are wrapped in
    result: str = "void"

    def declaration(self, keyword, indent=0):
        # `keyword` <result> (*posenc_<name>_fn)(...), its lines aligned after the parenthesis.
        head = "%s %s (*posenc_%s_fn)(" % (keyword, self.result, self.name)
        return head + ("\n" + " " * (indent + len(head))).join(self.params) + ")"


FUNCTION_TYPES = [
    FunctionType("rotate",
                 ("Pairs 0..n-1 of row x into out (out may be x for the in-place kinds).",),
                 ("const void* x, void* out, const void* c, const void* s,",
                  "Py_ssize_t n, int inverse")),
    FunctionType("position",
                 ("Rows 0..nrows-1, `stride` elements apart: pairs 0..n-1 of row r rotated by",
                  "the cos/sin rows c, s + r * table_stride (0: one position's rows); out may",
                  "be x for the in-place kinds."),
                 ("const void* x, void* out, Py_ssize_t nrows, Py_ssize_t stride,",
                  "const void* c, const void* s, Py_ssize_t table_stride,",
                  "Py_ssize_t n, int inverse")),
    FunctionType("add", ("out[i] = x[i] + row[i] (out may be x for the in-place kind).",),
                 ("const void* x, void* out, const void* row, Py_ssize_t n",)),
    FunctionType("cos_sin", ("Rows first..stop-1 of a cos/sin table: "
                             "cos_out[r * cos_stride + i] = scale*cos(positions[r]*w[i]).",),
                 ("const double* positions, Py_ssize_t first, Py_ssize_t stop,",
                  "const posenc_trig_steps* steps, double* thread_work,",
                  "double scale, void* cos_out, Py_ssize_t cos_stride,",
                  "void* sin_out, Py_ssize_t sin_stride")),
    FunctionType("sinusoidal",
                 ("Rows first..stop-1 of a sinusoidal table of `dim` columns "
                  "(split: all sin, then all cos);",
                  "stream: a large table, written by non-temporal stores where the kernel "
                  "has them."),
                 ("const double* positions, Py_ssize_t first, Py_ssize_t stop,",
                  "const posenc_trig_steps* steps, double* thread_work,",
                  "void* out, Py_ssize_t dim, int split, int stream")),
    FunctionType("convert", ("dst[i] = src[i] converted (float32 <-> a half type: "
                             "widened exactly, narrowed once).",),
                 ("const void* src, void* dst, Py_ssize_t n",)),
    FunctionType("alibi", ("out[j] = (x[j] +) slope * (start + step*j) in double, "
                           "rounded once; x NULL: fill.",),
                 ("const void* x, void* out, double slope, double start,",
                  "double step, const double* ramp, Py_ssize_t n")),
    FunctionType("sum_squares", ("The sum of x[i]**2 over a float or double row, in double: 32 running sums",
                                 "(x[i]**2 into sum i % 32) added pairwise (sum j + sum j + 16, + 8, + 4, + 2, + 1).",),
                 ("const void* x, Py_ssize_t n",), "double"),
    FunctionType("scale_row", ("out[i] = (x[i] * scale) * weight[i], scale rounded to the row's type, float or",
                               "double (out may be x).",),
                 ("const void* x, void* out, const void* weight, Py_ssize_t n, double scale",)),
    FunctionType("norm_half", ("scale_row of a float row of 2n features, rotated (pairs (i, i + n) by c[i], s[i])",
                               "and stored in the table's dtype, rounded once: the three passes in one.",),
                 ("const float* x, void* out, const float* weight, double scale,",
                  "const float* c, const float* s, Py_ssize_t n")),
    FunctionType("norm_rows", ("Rows first .. stop - 1 of a posenc_norm_job, each by sum_squares, its scale and",
                               "norm_half (a half type widened into `scratch`, two rows of dim floats).",),
                 ("const posenc_norm_job* job, Py_ssize_t first, Py_ssize_t stop, float* scratch",)),
]


def c_comment(lines):
    return "/* " + "\n   ".join(lines) + " */"


class TableField(NamedTuple):
    """A field of posenc_kernel_table (posenc_tables.h fills them in this order)."""

    type: str
    name: str
    dims: str = ""  # its array dimensions
    comment: str = ""  # a C comment after it


_BY_DTYPE = "[%s]" % DTYPE_ENUM[-1]
_BY_PAIR = _BY_DTYPE * 2
TABLE_FIELDS = [
    TableField("const char*", "simd"),
    TableField("posenc_rotate_fn", "rotate", _BY_PAIR + "[%s]" % ROW_KIND_ENUM[-1]),
    TableField("posenc_position_fn", "rotate_position",
               _BY_PAIR + "[%s]" % POSITION_KIND_ENUM[-1]),
    TableField("posenc_add_fn", "add", _BY_PAIR),
    TableField("posenc_add_fn", "add_in_place", _BY_PAIR),
    TableField("posenc_cos_sin_fn", "cos_sin", _BY_DTYPE),
    TableField("posenc_sinusoidal_fn", "sinusoidal", _BY_DTYPE),
    TableField("posenc_alibi_fn", "alibi_fill", _BY_DTYPE),
    TableField("posenc_alibi_fn", "alibi_add", _BY_DTYPE),
    TableField("posenc_alibi_fn", "alibi_add_in_place", _BY_DTYPE),
    TableField("posenc_convert_fn", "from_f32", _BY_DTYPE, "NULL: not a half type"),
    TableField("posenc_convert_fn", "to_f32", _BY_DTYPE),
    TableField("posenc_sum_squares_fn", "sum_squares", _BY_DTYPE, "NULL: a half type (normed in float32)"),
    TableField("posenc_scale_row_fn", "scale_row", _BY_DTYPE, "NULL: a half type"),
    TableField("posenc_norm_half_fn", "norm_half", _BY_DTYPE, "by the stored dtype; NULL: no vectors for it"),
    TableField("posenc_norm_rows_fn", "norm_rows", _BY_DTYPE, "x's and out's dtype; NULL: no vectors for it"),
]


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


def arithmetic(prefix):
    # The kernels of the types that are their own arithmetic type (float32, float64).
    return ", ".join("NULL" if d.suffix in HALF else prefix + d.suffix for d in DTYPES)
