/* posenc_fast.h: the C API of posenc_fast, for compiled callers.

   A versioned table of function pointers, fetched once at module init from
   the capsule posenc_fast._C_API (as NumPy's import_array() does):

       #include "posenc_fast.h"      (include_dirs=[posenc_fast.get_include()])
       ...
       PyMODINIT_FUNC PyInit_mine(void) {
           if (import_posenc_fast() < 0) return NULL;   (ImportError set)
           ...
       }
       ...
       int status = posenc_fast_API->rotate(&rows, &table, POSENC_FAST_HALF, 0);

   Every function may be called without the GIL, takes no Python object,
   returns a posenc_fast_status and writes nothing unless it returns
   POSENC_FAST_OK.  Results are bitwise those of the Python API (the same
   row kernels, the same canonical cos/sin values, whatever the thread
   count).  Large calls use posenc_fast's threads (set_num_threads).

   posenc_fast_API is a static variable: call import_posenc_fast() in every
   translation unit that uses it, or pass the pointer on. */
#ifndef POSENC_FAST_H
#define POSENC_FAST_H

#include <Python.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Changes whenever the table or a type below changes incompatibly. */
#define POSENC_FAST_ABI_VERSION 1
#define POSENC_FAST_CAPSULE "posenc_fast._C_API"
/* Name of the capsules posenc_fast.rotary_table_capsule() returns. */
#define POSENC_FAST_ROTARY_CAPSULE "posenc_fast.rotary_table"

/* Element types; 0 is no type.  A (data, table) pair without a kernel
   answers POSENC_FAST_ERR_DTYPE (half data take float32 or their own type). */
typedef enum {
    POSENC_FAST_FLOAT32 = 1,
    POSENC_FAST_FLOAT64 = 2,
    POSENC_FAST_FLOAT16 = 3,   /* IEEE binary16, computed in float32 and rounded once */
    POSENC_FAST_BFLOAT16 = 4   /* bfloat16 (ml_dtypes.bfloat16), likewise */
} posenc_fast_dtype;

/* Pair layouts (0 is none): rotations take HALF (pairs (i, i + r/2)) or
   INTERLEAVED (pairs (2i, 2i+1)); sinusoidal tables take INTERLEAVED
   (sin, cos, sin, ...) or SPLIT (all sin, then all cos). */
typedef enum {
    POSENC_FAST_HALF = 1,
    POSENC_FAST_INTERLEAVED = 2,
    POSENC_FAST_SPLIT = 3
} posenc_fast_layout;

typedef enum {
    POSENC_FAST_OK = 0,
    POSENC_FAST_ERR_NULL = 1,        /* a required pointer is NULL */
    POSENC_FAST_ERR_DTYPE = 2,       /* a dtype not in the enum or this build, or not the table's */
    POSENC_FAST_ERR_SIZE = 3,        /* a negative, inconsistent or overflowing size or stride */
    POSENC_FAST_ERR_RANGE = 4,       /* a position outside the table, a non-finite angle, scale
                                        or slope, a base <= 0, an ALiBi |offset| > 2**52 */
    POSENC_FAST_ERR_ARGUMENT = 5,    /* a layout or flag outside its values */
    POSENC_FAST_ERR_OVERLAP = 6,     /* an output overlaps an input without being x itself */
    POSENC_FAST_ERR_MEMORY = 7,      /* scratch memory could not be allocated */
    POSENC_FAST_ERR_UNSUPPORTED = 8  /* inverse through a table with an attention factor != 1 */
} posenc_fast_status;

/* The rows to rotate: x (and out) are C-contiguous arrays of shape
   (outer, seq, inner, dim).  Row (o, s, i) has the position
   offset + positions[s], or offset + s when positions is NULL.  out may be
   x (in place) and must not otherwise overlap it. */
typedef struct {
    posenc_fast_dtype dtype;
    const void* x;
    void* out;
    int64_t outer, seq, inner, dim;
    const int64_t* positions;
    int64_t offset;
} posenc_fast_rows;

/* A caller's cos/sin table: row t starts at cos + t * stride elements (sin
   likewise) and holds npairs values; the first 2 * npairs features of a row
   rotate, the rest are copied.  Used as given (no attention factor). */
typedef struct {
    posenc_fast_dtype dtype;
    const void* cos;
    const void* sin;
    int64_t rows, stride, npairs;
} posenc_fast_cos_sin;

/* A RotaryEmbedding's canonical cos/sin table for one dtype and positions
   [0, n): from Python, capsule = posenc_fast.rotary_table_capsule(rope, n,
   dtype=...), then PyCapsule_GetPointer(capsule, POSENC_FAST_ROTARY_CAPSULE).
   The pointer stays valid while the capsule lives (it owns a reference to
   the table, which is never changed): keep the capsule. */
typedef struct posenc_fast_rotary posenc_fast_rotary;

typedef struct {
    unsigned int abi_version;   /* POSENC_FAST_ABI_VERSION */
    /* A static English sentence for a status. */
    const char* (*status_message)(int status);
    /* Rotate rows by a caller's table (table row = the row's position).
       Arithmetic in the wider of the two dtypes, rounded once. */
    int (*rotate)(const posenc_fast_rows* rows, const posenc_fast_cos_sin* table,
                  posenc_fast_layout layout, int inverse);
    /* RotaryEmbedding.apply: rows->dtype and rows->dim must be the table's;
       inverse (0/1) as apply's. */
    int (*rotate_rotary)(const posenc_fast_rows* rows, const posenc_fast_rotary* rotary,
                         int inverse);
    /* cos[r * stride + i] = scale * cos(positions[r] * freqs[i]); sin likewise
       (RotaryEmbedding.cos_sin with freqs = rope.inv_freq_for(n) and scale =
       its attention factor).  ERR_OVERLAP only where the tables' rows share an
       element with each other, positions or freqs: cos and sin may be the two
       halves of one row (sin = cos + npairs, stride >= 2 * npairs). */
    int (*fill_cos_sin)(posenc_fast_dtype dtype, void* cos, void* sin, int64_t stride,
                        const double* positions, int64_t n, const double* freqs,
                        int64_t npairs, double scale);
    /* out: C-contiguous (n, dim), row r the encoding of positions[r]
       (sinusoidal_table: w_i = base ** (-2i/dim); layout INTERLEAVED or SPLIT). */
    int (*fill_sinusoidal)(posenc_fast_dtype dtype, void* out, const double* positions,
                           int64_t n, int64_t dim, double base, posenc_fast_layout layout);
    /* add_alibi: scores and out C-contiguous (batch, heads, q_len, k_len), out
       may be scores; head h gets slopes[h]; the first query is at offset. */
    int (*add_alibi)(posenc_fast_dtype dtype, const void* scores, void* out, int64_t batch,
                     int64_t heads, int64_t q_len, int64_t k_len, const double* slopes,
                     int64_t offset, int causal);
} posenc_fast_api;

static const posenc_fast_api* posenc_fast_API = NULL;

/* Fetch the table expecting `version`; 0, or -1 with an ImportError set. */
static int posenc_fast_import_version(unsigned int version) {
    PyObject* module = PyImport_ImportModule("posenc_fast");
    PyObject* capsule;
    const posenc_fast_api* api;
    if (module == NULL) return -1;
    capsule = PyObject_GetAttrString(module, "_C_API");
    Py_DECREF(module);
    if (capsule == NULL) return -1;
    /* The table is static in posenc_fast._core, which is never unloaded. */
    api = (const posenc_fast_api*)PyCapsule_GetPointer(capsule, POSENC_FAST_CAPSULE);
    Py_DECREF(capsule);
    if (api == NULL) return -1;
    if (api->abi_version != version) {
        PyErr_Format(PyExc_ImportError,
                     "posenc_fast C API version mismatch: this module was compiled against "
                     "ABI version %u, the installed posenc_fast provides version %u; rebuild "
                     "it with include_dirs=[posenc_fast.get_include()] of the installed "
                     "posenc_fast", version, api->abi_version);
        return -1;
    }
    posenc_fast_API = api;
    return 0;
}

/* Call at module init: 0, or -1 with an ImportError set. */
static inline int import_posenc_fast(void) {
    return posenc_fast_import_version(POSENC_FAST_ABI_VERSION);
}

#ifdef __cplusplus
}
#endif

#endif /* POSENC_FAST_H */
