# Declarations of csrc/posenc_kernels.h (generated from its .tp) for _core:
# the table of row kernels, the canonical cos/sin walk and the build constants.

cdef extern from "posenc_kernels.h" nogil:
    const char* POSENC_SIMD
    enum:
        POSENC_F32
        POSENC_F64
        POSENC_F16
        POSENC_BF16
        POSENC_NUM_DTYPES
        POSENC_ROW_HALF
        POSENC_ROW_HALF_IN_PLACE
        POSENC_ROW_HALF_VEC
        POSENC_ROW_HALF_IN_PLACE_VEC
        POSENC_ROW_INTERLEAVED
        POSENC_ROW_HALF_STREAM
        POSENC_ROW_INTERLEAVED_STREAM
        POSENC_NUM_ROW_KINDS
        POSENC_POSITION_HALF
        POSENC_POSITION_HALF_IN_PLACE
        POSENC_POSITION_INTERLEAVED
        POSENC_NUM_POSITION_KINDS
        POSENC_ROW_CHUNK
        POSENC_STREAM_BYTES
        POSENC_PREFETCH_BYTES
        POSENC_POSITION_BLOCK_BYTES
        POSENC_ROW_BLOCK_BYTES
        POSENC_ELEMENTS_PER_ITEM
        POSENC_CACHE_GROWTH
        POSENC_CACHE_BYTES
        POSENC_TRIG_SHARED_ROWS
        POSENC_TRIG_THREAD_ROWS
        POSENC_TRIG_CHUNK_ROWS
        POSENC_RAMP

    ctypedef struct posenc_trig_steps:
        Py_ssize_t n

    ctypedef void (*posenc_rotate_fn)(const void* x, void* out, const void* c, const void* s,
                                      Py_ssize_t n, int inverse)
    ctypedef void (*posenc_position_fn)(const void* x, void* out, Py_ssize_t nrows,
                                        Py_ssize_t stride, const void* c, const void* s,
                                        Py_ssize_t table_stride, Py_ssize_t n, int inverse)
    ctypedef void (*posenc_add_fn)(const void* x, void* out, const void* row, Py_ssize_t n)
    ctypedef void (*posenc_cos_sin_fn)(const double* positions, Py_ssize_t first,
                                       Py_ssize_t stop, const posenc_trig_steps* steps,
                                       double* thread_work, double scale, void* cos_out,
                                       Py_ssize_t cos_stride, void* sin_out,
                                       Py_ssize_t sin_stride)
    ctypedef void (*posenc_sinusoidal_fn)(const double* positions, Py_ssize_t first,
                                          Py_ssize_t stop, const posenc_trig_steps* steps,
                                          double* thread_work, void* out, Py_ssize_t dim,
                                          int split, int stream)
    ctypedef void (*posenc_convert_fn)(const void* src, void* dst, Py_ssize_t n)
    ctypedef void (*posenc_alibi_fn)(const void* x, void* out, double slope, double start,
                                     double step, const double* ramp, Py_ssize_t n)

    ctypedef struct posenc_kernel_table:
        const char* simd
        posenc_rotate_fn rotate[POSENC_NUM_DTYPES][POSENC_NUM_DTYPES][POSENC_NUM_ROW_KINDS]
        posenc_position_fn rotate_position[POSENC_NUM_DTYPES][POSENC_NUM_DTYPES][POSENC_NUM_POSITION_KINDS]
        posenc_add_fn add[POSENC_NUM_DTYPES][POSENC_NUM_DTYPES]
        posenc_add_fn add_in_place[POSENC_NUM_DTYPES][POSENC_NUM_DTYPES]
        posenc_cos_sin_fn cos_sin[POSENC_NUM_DTYPES]
        posenc_sinusoidal_fn sinusoidal[POSENC_NUM_DTYPES]
        posenc_alibi_fn alibi_fill[POSENC_NUM_DTYPES]
        posenc_alibi_fn alibi_add[POSENC_NUM_DTYPES]
        posenc_alibi_fn alibi_add_in_place[POSENC_NUM_DTYPES]
        posenc_convert_fn from_f32[POSENC_NUM_DTYPES]
        posenc_convert_fn to_f32[POSENC_NUM_DTYPES]

    # The table compiled into the including module (with its ISA flags).
    const posenc_kernel_table posenc_kernels

    int posenc_dtype_index(int typenum)
    int posenc_table_dtype(int d)
    void posenc_set_bf16_typenum(int typenum)
    void posenc_trig_steps_init(posenc_trig_steps* steps, const double* w, double* work,
                                Py_ssize_t n)
    void posenc_prefetch_ahead(const void* p, Py_ssize_t nbytes)
    void posenc_sfence()
