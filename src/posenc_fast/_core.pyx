# cython: language_level=3, freethreading_compatible=True
"""The compiled layer of posenc_fast, built once with the portable flags.

It holds what does not depend on the instruction set: the loops over rows
and threads, the plans of the fast paths, RotaryEmbedding's cos/sin cache.
The row kernels (csrc/posenc_kernels.h) are called through a table of
function pointers: this module's own, compiled for the baseline, until
``_dispatch`` lends it the table of a wider variant (``use_kernels``).

The functions trust their inputs: the Python layer has already checked
dtypes, shapes, contiguity, ranges and aliasing, and allocated every output
(arrays with a dtype the table lacks are refused, never read).  They never
raise on valid input, never allocate a temporary the size of the data, and
run without the GIL.  Angles are formed in double precision (see
csrc/posenc_trig.h): a cos/sin value depends only on the position and the
frequency, never on the call, the row, the thread count or the variant.
"""

cimport cython
cimport numpy as cnp
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from libc.stdint cimport int64_t
from libc.string cimport memcmp, memcpy

from posenc_fast._kernel_table cimport *

cdef extern from "posenc_numpy_compat.h":
    pass

cdef extern from "posenc_pool.h" nogil:
    ctypedef void (*posenc_item_fn)(void* ctx, Py_ssize_t item, int slot) noexcept nogil
    int POSENC_POOL
    void posenc_parallel_for(Py_ssize_t n, int threads, posenc_item_fn fn, void* ctx)
    int POSENC_POOL_HOLD_BEFORE_ITEMS, POSENC_POOL_HOLD_ON_ITEM
    int POSENC_POOL_BACKOFF_FIRST, POSENC_POOL_BACKOFF_MAX, POSENC_POOL_CLEAN_CALLS
    void posenc_pool_hold(int hold)
    enum: POSENC_POOL_NCOUNTS
    void posenc_pool_counts(int64_t* counts)
    void posenc_pool_reset_backoff()

cnp.import_array()

# The row kernels in use; every variant gives bitwise the same results.
cdef const posenc_kernel_table* K = &posenc_kernels


def use_kernels(capsule):
    """Call the row kernels of `capsule` (an ``_isa_<variant>.KERNELS``) from now on."""
    global K
    K = <const posenc_kernel_table*>PyCapsule_GetPointer(capsule, b"posenc_fast.kernel_table")


def kernels_in_use():
    """The row kernels called now, as `use_kernels` takes them (the baseline's too)."""
    return PyCapsule_New(<void*>K, b"posenc_fast.kernel_table", NULL)


def set_bfloat16_typenum(int typenum):
    """Accept arrays of NumPy type number `typenum` (ml_dtypes.bfloat16's) as bfloat16."""
    posenc_set_bf16_typenum(typenum)


def thread_pool_enabled():
    """Return True if large calls can run on the thread pool (csrc/posenc_pool.h)."""
    return bool(POSENC_POOL)


def hold_workers(hold):
    """Test hook: hold the pool's workers back as if they had no core, or release them.

    `hold` is False (release: returns once no worker is held), True (after
    they join a call, before any item) or "on_item" (after each claims its
    first item: the caller then starts only once every worker admitted to
    the call holds one).
    """
    cdef int mode
    if hold is not False and hold is not True and hold != "on_item":
        raise ValueError(f"hold must be False, True or 'on_item', got {hold!r}")
    mode = (POSENC_POOL_HOLD_ON_ITEM if hold == "on_item"
            else POSENC_POOL_HOLD_BEFORE_ITEMS if hold is True else 0)
    with nogil:
        posenc_pool_hold(mode)


# The pool's back-off constants: (first period, longest period, clean calls that halve it).
POOL_BACKOFF = (POSENC_POOL_BACKOFF_FIRST, POSENC_POOL_BACKOFF_MAX, POSENC_POOL_CLEAN_CALLS)
POOL_COUNTS = ("calls", "capped", "late", "period", "left", "cap", "worker_items",
               "caller_waiting", "stood_down")
assert len(POOL_COUNTS) == POSENC_POOL_NCOUNTS, "POOL_COUNTS names posenc_pool_counts' values"


def pool_counts():
    """Test hook: the pool's back-off (csrc/posenc_pool.h) and counts since import.

    calls (calls that asked for threads), capped (of them, backed off), late
    (late calls), period, left and cap (the back-off now), worker_items
    (items run by workers), caller_waiting (1 while a caller waits for them,
    2 once it judged them late), stood_down (workers that found themselves
    on their caller's CPU and left the call to it).
    """
    cdef int64_t counts[POSENC_POOL_NCOUNTS]
    posenc_pool_counts(counts)
    return {name: counts[i] for i, name in enumerate(POOL_COUNTS)}


def reset_backoff():
    """Test hook: forget the pool's back-off (no call may run meanwhile)."""
    posenc_pool_reset_backoff()


def simd_level():
    """Return the widest SIMD instruction set of the row kernels in use."""
    return K.simd.decode()


cdef int _thread_limit = 1
# Elements below which a call stays on one thread (_threads.MIN_ELEMENTS_PER_THREAD).
cdef Py_ssize_t _min_elements_per_thread = 1 << 16


def set_thread_limit(int n, Py_ssize_t min_elements_per_thread):
    """Mirror of posenc_fast.set_num_threads for the fast paths (called by _threads.py)."""
    global _thread_limit, _min_elements_per_thread
    _thread_limit = max(1, n)
    _min_elements_per_thread = max(<Py_ssize_t>1, min_elements_per_thread)


cdef inline Py_ssize_t _rows_per_item(Py_ssize_t row_elements) noexcept nogil:
    # Rows of row_elements per pool work item where items would otherwise be
    # single short rows: POSENC_ELEMENTS_PER_ITEM elements (posenc_config.h).
    return max(<Py_ssize_t>1, POSENC_ELEMENTS_PER_ITEM // max(row_elements, <Py_ssize_t>1))


cdef inline int _threads_for(Py_ssize_t elements) noexcept nogil:
    cdef Py_ssize_t n = elements // _min_elements_per_thread
    return <int>max(<Py_ssize_t>1, min(<Py_ssize_t>_thread_limit, n))


cdef inline int _dtype(cnp.ndarray a) except -1:
    cdef int index = posenc_dtype_index(cnp.PyArray_TYPE(a))
    if index < 0:
        raise TypeError(f"no kernel for dtype {a.dtype}")
    return index


cdef inline char* _data(cnp.ndarray a) noexcept:
    return <char*>cnp.PyArray_DATA(a)


include "_core_tables.pxi"
include "_core_rotate.pxi"
include "_core_blocks.pxi"
include "_core_rotary.pxi"
include "_core_walk.pxi"
include "_core_tokens.pxi"
include "_core_norm.pxi"
include "_core_relative.pxi"
include "_core_streams.pxi"
include "_core_capi.pxi"
include "_core_kv_cache.pxi"
include "_core_mla.pxi"
include "_core_torch.pxi"
include "_core_hf.pxi"
