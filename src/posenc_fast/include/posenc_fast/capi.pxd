# Cython declarations of posenc_fast.h, the C API of posenc_fast.
#
#     # cythonize(..., include_path=[posenc_fast.get_include()]),
#     # Extension(..., include_dirs=[posenc_fast.get_include()])
#     cimport posenc_fast.capi as pf
#     pf.import_posenc_fast()          # at module level: ImportError on a mismatch
#     ...
#     with nogil:
#         status = pf.posenc_fast_API.rotate(&rows, &table, pf.POSENC_FAST_HALF, 0)
#
# See posenc_fast.h for the meaning of every field and function.

from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.stdint cimport int64_t

cdef extern from "posenc_fast.h" nogil:
    enum:
        POSENC_FAST_ABI_VERSION

    const char* POSENC_FAST_CAPSULE
    const char* POSENC_FAST_ROTARY_CAPSULE

    ctypedef enum posenc_fast_dtype:
        POSENC_FAST_FLOAT32
        POSENC_FAST_FLOAT64
        POSENC_FAST_FLOAT16
        POSENC_FAST_BFLOAT16

    ctypedef enum posenc_fast_layout:
        POSENC_FAST_HALF
        POSENC_FAST_INTERLEAVED
        POSENC_FAST_SPLIT

    ctypedef enum posenc_fast_status:
        POSENC_FAST_OK
        POSENC_FAST_ERR_NULL
        POSENC_FAST_ERR_DTYPE
        POSENC_FAST_ERR_SIZE
        POSENC_FAST_ERR_RANGE
        POSENC_FAST_ERR_ARGUMENT
        POSENC_FAST_ERR_OVERLAP
        POSENC_FAST_ERR_MEMORY
        POSENC_FAST_ERR_UNSUPPORTED

    ctypedef struct posenc_fast_rows:
        posenc_fast_dtype dtype
        const void* x
        void* out
        int64_t outer
        int64_t seq
        int64_t inner
        int64_t dim
        const int64_t* positions
        int64_t offset

    ctypedef struct posenc_fast_cos_sin:
        posenc_fast_dtype dtype
        const void* cos
        const void* sin
        int64_t rows
        int64_t stride
        int64_t npairs

    ctypedef struct posenc_fast_rotary

    ctypedef struct posenc_fast_api:
        unsigned int abi_version
        const char* (*status_message)(int status) noexcept nogil
        int (*rotate)(const posenc_fast_rows* rows, const posenc_fast_cos_sin* table,
                      posenc_fast_layout layout, int inverse) noexcept nogil
        int (*rotate_rotary)(const posenc_fast_rows* rows, const posenc_fast_rotary* rotary,
                             int inverse) noexcept nogil
        int (*fill_cos_sin)(posenc_fast_dtype dtype, void* cos, void* sin, int64_t stride,
                            const double* positions, int64_t n, const double* freqs,
                            int64_t npairs, double scale) noexcept nogil
        int (*fill_sinusoidal)(posenc_fast_dtype dtype, void* out, const double* positions,
                               int64_t n, int64_t dim, double base,
                               posenc_fast_layout layout) noexcept nogil
        int (*add_alibi)(posenc_fast_dtype dtype, const void* scores, void* out, int64_t batch,
                         int64_t heads, int64_t q_len, int64_t k_len, const double* slopes,
                         int64_t offset, int causal) noexcept nogil

    const posenc_fast_api* posenc_fast_API


cdef extern from "posenc_fast.h":
    int posenc_fast_import_version(unsigned int version) except -1
    int import_posenc_fast() except -1


cdef inline const posenc_fast_rotary* rotary_from_capsule(object capsule) except NULL:
    """The table a posenc_fast.rotary_table_capsule() holds (valid while the capsule lives)."""
    return <const posenc_fast_rotary*>PyCapsule_GetPointer(capsule, POSENC_FAST_ROTARY_CAPSULE)
