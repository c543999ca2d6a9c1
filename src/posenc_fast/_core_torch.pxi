# CPU torch tensors read in C: the per-call glue of posenc_fast.vllm, torch_ops and hf.
#
# A decode step hands an op a few small tensors; viewing them through
# Tensor.numpy() and checking them in Python cost several times the kernel.
# Here a plain, strided CPU tensor (or nn.Parameter: a model's weights) of a
# known dtype is read as its data pointer, sizes and strides (`Strided`,
# _core_tokens.pxi; an ndarray over
# its memory, the tensor its base, only where a NumPy path takes it: the
# drop-ins' decode call (TensorRotation) and vLLM's rotation and q/k norm
# make none, ~1-2 us less a call), read through
# DLPack's C exchange table (`__dlpack_c_exchange_api__`, DLPack 1.3;
# torch 2.13 has it: one C call a tensor) where torch has one, else
# through the tensor's attributes (seven reads a tensor); new tensors are
# handed to torch through the same table (a block of our own: cheaper than
# torch.from_numpy, and NumPy has no bfloat16 for torch to map).  Anything
# else (a subclass such as a compiler's fake tensor, another device or
# layout, a negated view, data needing a gradient in grad mode, an error
# reading it) gives None: the Python layer then checks fully and raises the
# documented errors.  torch is never imported here: the Python layer
# registers it once it has seen a tensor (`register_torch`).

import numpy as np
from cpython.exc cimport PyErr_Clear
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.stdint cimport int32_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc

cdef extern from "numpy/arrayobject.h":
    # Takes a reference to `descr`; `data` not NULL: the array's memory.
    object PyArray_NewFromDescr(void* subtype, void* descr, int nd, cnp.npy_intp* dims,
                                cnp.npy_intp* strides, void* data, int flags, void* obj)

# DLPack's C ABI (dlpack.h, major version 1): the fields read here.
ctypedef struct DLDevice:
    int device_type  # an enum in C: an int
    int32_t device_id

ctypedef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

ctypedef struct DLTensor:
    void* data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t* shape
    int64_t* strides
    uint64_t byte_offset

ctypedef struct DLPackVersion:
    uint32_t major
    uint32_t minor

ctypedef struct DLManagedTensorVersioned:
    DLPackVersion version
    void* manager_ctx
    void (*deleter)(DLManagedTensorVersioned* self) noexcept nogil
    uint64_t flags
    DLTensor dl_tensor

ctypedef struct DLPackExchangeAPI:
    DLPackVersion version
    void* prev_api
    void* managed_tensor_allocator
    void* managed_tensor_from_py_object_no_sync
    int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned* tensor, void** out) noexcept
    int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out) noexcept
    void* current_work_stream

cdef enum:
    DL_CPU = 1  # DLDeviceType
    DL_INT = 0  # DLDataTypeCode
    DL_UINT = 1
    DL_FLOAT = 2
    DL_BFLOAT = 4
    DL_BOOL = 6

cdef object _Tensor = None        # torch.Tensor
cdef object _Parameter = None     # torch.nn.Parameter (a model's weights): read as a plain tensor
cdef object _strided = None       # torch.strided
cdef object _grad_enabled = None  # torch.is_grad_enabled
cdef object _from_numpy = None    # torch.from_numpy
cdef object _empty = None         # torch.empty
cdef object _bfloat16 = None      # torch.bfloat16
cdef object _stride = None        # TensorBase's own methods, unbound: no bound method a call
cdef object _data_ptr = None
cdef object _is_neg = None
cdef dict _descrs = {}            # torch dtype -> NumPy dtype of the same bits
cdef list _dl_descrs = []         # [DLPack type code * 4 + log2(bytes)] -> NumPy dtype or None
cdef const DLPackExchangeAPI* _dlpack = NULL
cdef object _increment_version = None  # torch._C._increment_version
cdef object _inference_mode = None     # torch.is_inference_mode_enabled
cdef object _is_inference = None        # TensorBase.is_inference, unbound


cdef bint _writable(tuple tensors):
    # Whether torch lets a call write `tensors` (None: none) in place: an inference tensor only under
    # inference mode (its rule; the general paths raise on the others).
    if _inference_mode() is True:
        return True
    for t in tensors:
        if t is not None and _is_inference(t):
            return False
    return True


cdef int _count_writes(tuple tensors) except -1:
    # Tell autograd that `tensors` were written in place: their version counters, as torch's in-place
    # ops count them (a graph that saved one then refuses its backward).
    _increment_version(tensors)
    return 0


def register_torch(torch, dict descrs, bint by_dlpack=True):
    """Let the compiled paths read and make torch tensors; `descrs`: torch dtype -> NumPy dtype.

    `by_dlpack` False: through the tensors' attributes even where torch has
    DLPack's C exchange table (for tests: the two readers agree).
    """
    global _Tensor, _Parameter, _strided, _grad_enabled, _from_numpy, _bfloat16, _descrs
    global _stride, _data_ptr, _is_neg, _empty, _dl_descrs, _dlpack, _increment_version, _inference_mode
    global _is_inference
    _empty = torch.empty
    _increment_version, _inference_mode = torch._C._increment_version, torch.is_inference_mode_enabled
    _is_inference = torch._C.TensorBase.is_inference
    _strided, _grad_enabled, _from_numpy = torch.strided, torch.is_grad_enabled, torch.from_numpy
    base = torch._C.TensorBase
    _stride, _data_ptr, _is_neg = base.stride, base.data_ptr, base.is_neg
    _bfloat16, _descrs = torch.bfloat16, dict(descrs)
    _dl_descrs = [None] * (4 * (DL_BOOL + 1))
    for dtype, d in _descrs.items():
        code = (DL_BFLOAT if dtype is torch.bfloat16 else DL_BOOL if d.kind == "b" else DL_INT if d.kind == "i"
                else DL_UINT if d.kind == "u" else DL_FLOAT)
        _dl_descrs[4 * code + d.itemsize.bit_length() - 1] = d
    _dlpack = _exchange_table(torch.Tensor) if by_dlpack else NULL
    _Tensor, _Parameter = torch.Tensor, torch.nn.Parameter


cdef const DLPackExchangeAPI* _exchange_table(object tensor_type):
    # torch's DLPack C exchange table, if it has one of DLPack 1 with every function used here.
    cdef const DLPackExchangeAPI* table
    capsule = getattr(tensor_type, "__dlpack_c_exchange_api__", None)
    if capsule is None:
        return NULL
    try:
        table = <const DLPackExchangeAPI*>PyCapsule_GetPointer(capsule, "dlpack_exchange_api")
    except ValueError:  # not a capsule of that name
        return NULL
    if (table.version.major != 1 or table.dltensor_from_py_object_no_sync == NULL
            or table.managed_tensor_to_py_object_no_sync == NULL):
        return NULL
    return table


def torch_reads_by_dlpack():
    """True when registered tensors are read through DLPack's C exchange table (else attributes)."""
    return _dlpack != NULL


def torch_kernel_dtypes():
    """The registered torch dtypes of the kernels, by kernel dtype index (TensorRotation's)."""
    found = {posenc_dtype_index((<cnp.dtype>d).type_num): t for t, d in _descrs.items()}
    return tuple(found[i] for i in range(POSENC_NUM_DTYPES))


cdef inline int _log2_bytes(int bits) noexcept:
    # DLPack's bits of an item as log2 of its bytes, or -1 for no NumPy item size.
    return 0 if bits == 8 else 1 if bits == 16 else 2 if bits == 32 else 3 if bits == 64 else -1


cdef object _tensor_array(object t, bint grad, bint floats_only):
    # The ndarray over `t`'s memory, or None (see above).
    cdef Strided v
    if not _tensor_strided(t, grad, floats_only, &v):
        return None
    return _array_over(<object>v.descr, v.nd, v.dims, v.steps, v.data, True, t)


cdef bint _tensor_strided(object t, bint grad, bint floats_only, Strided* v):
    # `t`'s memory into v, or False (see above).
    if type(t) is not _Tensor and type(t) is not _Parameter:
        return False
    return _dlpack_strided(t, grad, floats_only, v) if _dlpack != NULL else _attribute_strided(t, grad, floats_only, v)


cdef bint _dlpack_strided(object t, bint grad, bint floats_only, Strided* v):
    # _tensor_strided by one call of DLPack's table; the negative bit and requires_grad it does not say.
    cdef int k
    cdef DLTensor view
    try:
        if (grad and t.requires_grad) or _is_neg(t):
            return False
    except Exception:
        return False
    if _dlpack.dltensor_from_py_object_no_sync(<void*>t, &view) != 0:
        PyErr_Clear()  # e.g. a functorch wrapper or a sparse tensor: no strided memory
        return False
    k = _log2_bytes(view.dtype.bits)
    if (view.device.device_type != DL_CPU or view.dtype.lanes != 1 or view.data == NULL
            or view.dtype.code > DL_BOOL or k < 0 or view.ndim > STRIDED_AXES):
        return False
    found = _dl_descrs[4 * view.dtype.code + k]
    if found is None or floats_only and posenc_dtype_index((<cnp.dtype>found).type_num) < 0:
        return False
    v.descr, v.nd, v.data, v.writeable = <PyObject*>found, view.ndim, <char*>view.data + view.byte_offset, True
    v.type_num, v.itemsize = (<cnp.dtype>found).type_num, (<cnp.dtype>found).itemsize
    for k in range(view.ndim):
        v.dims[k] = view.shape[k]
        v.steps[k] = view.strides[k] * (<cnp.dtype>found).itemsize
    return True


cdef bint _attribute_strided(object t, bint grad, bint floats_only, Strided* v):
    # _tensor_strided by the tensor's attributes.
    cdef Py_ssize_t nd, k, address
    try:
        if not t.is_cpu or t.layout is not _strided or (grad and t.requires_grad) or _is_neg(t):
            return False
        found = _descrs.get(t.dtype)
        if found is None or floats_only and posenc_dtype_index((<cnp.dtype>found).type_num) < 0:
            return False
        shape, strides, address = t.shape, _stride(t), _data_ptr(t)
    except Exception:  # e.g. a functorch wrapper without storage
        return False
    nd = len(shape)
    if address == 0 or nd > STRIDED_AXES or len(strides) != nd:
        return False
    v.descr, v.nd, v.data, v.writeable = <PyObject*>found, <int>nd, <char*>address, True
    v.type_num, v.itemsize = (<cnp.dtype>found).type_num, (<cnp.dtype>found).itemsize
    for k in range(nd):
        v.dims[k] = shape[k]
        v.steps[k] = strides[k] * (<cnp.dtype>found).itemsize
    return True


cdef cnp.ndarray _array_over(object descr, int nd, cnp.npy_intp* dims, cnp.npy_intp* steps, void* data,
                             bint writeable, object base):
    # An ndarray of `descr` over `data` (steps NULL: C-contiguous), kept alive by `base`.
    cdef cnp.ndarray a
    Py_INCREF(descr)  # PyArray_NewFromDescr takes a reference to it
    a = PyArray_NewFromDescr(<void*>np.ndarray, <void*>descr, nd, dims, steps, data,
                             cnp.NPY_ARRAY_WRITEABLE if writeable else 0, NULL)
    cnp.set_array_base(a, base)
    return a


def tensor_arrays(tuple args, unsigned int optional, unsigned int integers):
    """NumPy views of `args`, all plain CPU tensors, made in C, or None (see _core_torch.pxi).

    Bit i of `optional`: args[i] may be None (kept); of `integers`: args[i]
    may have any dtype NumPy has (else a kernel's float dtype).
    """
    cdef Py_ssize_t i
    cdef list arrays = []
    cdef bint grad
    if _Tensor is None or len(args) > 32:
        return None
    grad = _grad_enabled() is True
    for i in range(len(args)):
        t = args[i]
        if t is None and optional >> i & 1:
            a = None
        else:
            a = _tensor_array(t, grad, not (integers >> i & 1))
            if a is None:
                return None
        arrays.append(a)
    return tuple(arrays)


cdef struct OwnedBlock:
    # One malloc'd block: the managed tensor torch takes, its shape and strides, then the data.
    DLManagedTensorVersioned managed
    int64_t shape[STRIDED_AXES]  # like's
    int64_t strides[STRIDED_AXES]


cdef void _free_block(DLManagedTensorVersioned* managed) noexcept nogil:
    # The deleter torch calls when the tensor's memory is freed (any thread, perhaps without the GIL).
    free(managed.manager_ctx)


cdef object _owned_output(const Strided* like, DLDataType dtype, char** data):
    # A new C-contiguous tensor of like's shape and `dtype` over one malloc'd block handed to torch
    # through its DLPack table, its memory at data[0]; None if that failed.
    cdef int k, nd = like.nd
    cdef Py_ssize_t nbytes = like.itemsize, head = (sizeof(OwnedBlock) + 63) // 64 * 64
    cdef void* tensor = NULL
    cdef char* base
    cdef OwnedBlock* block
    cdef int64_t step = 1
    for k in range(nd):
        nbytes *= like.dims[k]
    base = <char*>malloc(head + nbytes + 64)
    if base == NULL:
        return None
    block = <OwnedBlock*>(base + (-<Py_ssize_t>base & 63))  # data 64-byte aligned: head is a multiple of 64
    for k in range(nd - 1, -1, -1):
        block.shape[k], block.strides[k] = like.dims[k], step
        step *= like.dims[k]
    block.managed.version.major, block.managed.version.minor = 1, 0
    block.managed.manager_ctx, block.managed.deleter, block.managed.flags = base, _free_block, 0
    view = &block.managed.dl_tensor
    view.data, view.ndim, view.dtype, view.byte_offset = <char*>block + head, nd, dtype, 0
    view.shape, view.strides = block.shape, block.strides
    view.device.device_type, view.device.device_id = DL_CPU, 0
    if _dlpack.managed_tensor_to_py_object_no_sync(&block.managed, &tensor) != 0 or tensor == NULL:
        PyErr_Clear()  # torch called the deleter or never took the block: which is not said
        return None
    t = <object>tensor
    Py_DECREF(t)  # the new reference the table returned, now held by `t`
    data[0] = <char*>block + head
    return t


cdef object _new_output(const Strided* like, char** data):
    # A new C-contiguous tensor of like's shape and dtype, its memory at data[0]: a block handed
    # to torch through its DLPack table where it has one, else torch.from_numpy of a new array,
    # but for bfloat16 (NumPy has none for torch to map; .view(torch.bfloat16) of an int16 tensor
    # costs more than the allocation).
    cdef int k, typenum = like.type_num
    cdef cnp.ndarray a
    cdef DLDataType dtype
    cdef bint bf16 = posenc_dtype_index(typenum) == POSENC_BF16
    if _dlpack != NULL:
        dtype.code, dtype.bits, dtype.lanes = DL_BFLOAT if bf16 else DL_FLOAT, 8 * like.itemsize, 1
        made = _owned_output(like, dtype, data)
        if made is not None:
            return made
    if not bf16:
        a = cnp.PyArray_EMPTY(like.nd, <cnp.npy_intp*>like.dims, typenum, 0)
        data[0] = _data(a)
        return _from_numpy(a)
    shape = tuple([like.dims[k] for k in range(like.nd)])
    t = _empty(shape, dtype=_bfloat16, device="cpu")  # never the default device
    data[0] = <char*><Py_ssize_t>_data_ptr(t)
    return t


cdef bint _contiguous(const Strided* v) noexcept nogil:
    # v C-contiguous, its data aligned to its items (torch's own tensors always are; a view of a
    # buffer need not be).
    cdef Py_ssize_t itemsize = v.itemsize, step = itemsize
    cdef int k
    for k in range(v.nd - 1, -1, -1):
        if v.dims[k] == 0:
            return True
        if v.dims[k] != 1 and v.steps[k] != step:
            return False
        step *= v.dims[k]
    return <Py_ssize_t>v.data % itemsize == 0


# The compiled torch kernel's entry (torch_kernel/posenc_torch_kernel.h): vLLM's rotation on the
# pointers, sizes and strides torch's C++ kernel reads, without the GIL.

cdef extern from "torch_kernel/posenc_torch_kernel.h" nogil:  # beside _core.c
    enum:
        POSENC_TORCH_ENTRY_VERSION
        POSENC_TENSOR_INT64
    ctypedef struct posenc_tensor:
        void* data
        int dtype
        int nd
        const int64_t* sizes
        const int64_t* strides
    ctypedef int (*posenc_rotate_tokens_fn)(const posenc_tensor*, const posenc_tensor*, const posenc_tensor*,
                                            const posenc_tensor*, int64_t, int64_t, int, int) noexcept nogil
    ctypedef int (*posenc_tokens_to_cache_fn)(const posenc_tensor*, const posenc_tensor*, const posenc_tensor*,
                                              const posenc_tensor*, const posenc_tensor*, const posenc_tensor*,
                                              const posenc_tensor*, int64_t, const posenc_tensor*, int,
                                              int, const posenc_tensor*, const posenc_tensor*, double,
                                              double) noexcept nogil
    ctypedef int (*posenc_norm_tokens_fn)(const posenc_tensor*, const posenc_tensor*, const posenc_tensor*,
                                          const posenc_tensor*, const posenc_tensor*, int64_t, const posenc_tensor*,
                                          int, double, double) noexcept nogil
    ctypedef int (*posenc_mla_to_cache_fn)(const posenc_tensor*, const posenc_tensor*, const posenc_tensor*,
                                           const posenc_tensor*, const posenc_tensor*, int, const posenc_tensor*,
                                           const posenc_tensor*) noexcept nogil
    ctypedef void* (*posenc_allocate_fn)(void*, int) noexcept nogil
    ctypedef int (*posenc_hf_rotate_fn)(const char*, int64_t, const char*, int64_t, const posenc_tensor*, int,
                                        const posenc_tensor*, const posenc_tensor*, int64_t, posenc_allocate_fn,
                                        void*) noexcept nogil
    ctypedef struct posenc_torch_entries:
        posenc_rotate_tokens_fn rotate_tokens
        posenc_tokens_to_cache_fn tokens_to_cache
        posenc_norm_tokens_fn norm_tokens
        posenc_mla_to_cache_fn mla_to_cache
        posenc_hf_rotate_fn hf_rotate

cdef extern from "posenc_kernels.h" nogil:
    int posenc_bf16_typenum


cdef bint _tensor_view(const posenc_tensor* t, Strided* v) noexcept nogil:
    # The kernel's tensor into v (no NumPy dtype: descr NULL), or False.
    cdef int k, d = 0
    cdef Py_ssize_t itemsize = 8
    if t.data == NULL or t.nd < 0 or t.nd > STRIDED_AXES:
        return False
    if t.dtype == POSENC_TENSOR_INT64:
        v.type_num = cnp.NPY_INT64
    else:
        d = _kernel_dtype(t.dtype, &itemsize)
        if d < 0:
            return False
        v.type_num = (cnp.NPY_FLOAT32 if d == POSENC_F32 else cnp.NPY_FLOAT64 if d == POSENC_F64
                      else cnp.NPY_FLOAT16 if d == POSENC_F16 else posenc_bf16_typenum)
    v.descr, v.data, v.nd, v.writeable, v.itemsize = NULL, <char*>t.data, t.nd, True, itemsize
    for k in range(t.nd):
        v.dims[k], v.steps[k] = t.sizes[k], t.strides[k] * itemsize
    return True


cdef int _torch_rotate_tokens(const posenc_tensor* positions, const posenc_tensor* query, const posenc_tensor* key,
                              const posenc_tensor* cos_sin_cache, int64_t head_size, int64_t offset, int is_neox,
                              int inverse) noexcept nogil:
    # posenc_rotate_tokens_fn: rotate_tokens_fast's checks and call on the kernel's tensors.
    cdef Strided v[4]  # query, key, the cache, the positions
    cdef Py_ssize_t n = 1 if key == NULL else 2
    if not (_tensor_view(query, &v[0]) and (key == NULL or _tensor_view(key, &v[1]))
            and _tensor_view(cos_sin_cache, &v[2]) and _tensor_view(positions, &v[3])
            and _positions_apart(v, key != NULL)):
        return 0
    return _rotate_tokens(v, n, head_size, offset, is_neox != 0, inverse != 0)


cdef int _torch_tokens_to_cache(const posenc_tensor* positions, const posenc_tensor* query, const posenc_tensor* key,
                                const posenc_tensor* value, const posenc_tensor* key_cache,
                                const posenc_tensor* value_cache, const posenc_tensor* slot_mapping,
                                int64_t head_size, const posenc_tensor* cos_sin_cache, int is_neox,
                                int hnd, const posenc_tensor* q_weight, const posenc_tensor* k_weight, double eps,
                                double weight_offset) noexcept nogil:
    # posenc_tokens_to_cache_fn: tokens_to_cache_fast's checks and call on the kernel's tensors; with
    # weights, the arrays the norm makes under the GIL (all before its first write).
    cdef Strided v[8]  # as tokens_to_cache_fast's
    cdef Strided weights[2]
    cdef TokenRows rows[4]
    cdef CosSinTable table
    cdef TokenWalk w
    cdef Py_ssize_t tokens = 0
    cdef const long long* pos = NULL
    cdef int d = 0, j
    cdef const posenc_tensor* given[8]
    given[:] = [query, key, cos_sin_cache, positions, value, slot_mapping, key_cache, value_cache]
    if (not _fast_paths_on or head_size < 1 or (q_weight == NULL) != (k_weight == NULL)
            or not _norm_values_fit(eps, weight_offset)):
        return 0
    for j in range(8):
        if not _tensor_view(given[j], &v[j]):
            return 0
    if not (_positions_apart(v, True) and _cache_call(v, head_size, hnd != 0, rows, &table, &tokens, &pos, &d)):
        return 0
    w = _cache_walk_of(rows, tokens, head_size, d, _itemsize(&v[0]), &v[6], &v[7])
    if q_weight == NULL:
        return _walk_tokens_nogil(&w, <const long long*>v[5].data, pos, &table, is_neox != 0, False, 0,
                                  _cache_threads(&w)) == 0
    if not (_tensor_view(q_weight, &weights[0]) and _tensor_view(k_weight, &weights[1])):
        return 0
    with gil:
        try:
            return _normed_to_cache(&w, <const long long*>v[5].data, pos, &table, is_neox != 0, weights, eps,
                                    weight_offset)
        except BaseException:  # e.g. MemoryError: nothing written, the general path raises it
            return 0


cdef int _torch_norm_tokens(const posenc_tensor* positions, const posenc_tensor* query, const posenc_tensor* key,
                            const posenc_tensor* q_weight, const posenc_tensor* k_weight, int64_t head_size,
                            const posenc_tensor* cos_sin_cache, int is_neox, double eps,
                            double weight_offset) noexcept nogil:
    # posenc_norm_tokens_fn: fused_qk_norm_rope_fast's checks and call on the kernel's tensors, the
    # arrays it makes under the GIL (all before its first write: a failure there writes nothing).
    cdef Strided v[4]  # as fused_qk_norm_rope_fast's
    cdef Strided w[2]
    if not (_fast_paths_on and head_size >= 1 and _norm_values_fit(eps, weight_offset)
            and _tensor_view(query, &v[0]) and _tensor_view(key, &v[1]) and _tensor_view(cos_sin_cache, &v[2])
            and _tensor_view(positions, &v[3]) and _tensor_view(q_weight, &w[0])
            and _tensor_view(k_weight, &w[1]) and _positions_apart(v, True)):
        return 0
    with gil:
        try:
            return _norm_tokens(v, w, head_size, is_neox != 0, eps, weight_offset)
        except BaseException:  # e.g. MemoryError: nothing written, the general path raises it
            return 0


cdef int _torch_mla_to_cache(const posenc_tensor* positions, const posenc_tensor* q_pe, const posenc_tensor* k_pe,
                             const posenc_tensor* kv_c, const posenc_tensor* cos_sin_cache, int is_neox,
                             const posenc_tensor* slot_mapping, const posenc_tensor* kv_cache) noexcept nogil:
    # posenc_mla_to_cache_fn: mla_to_cache_fast's checks and call on the kernel's tensors.
    cdef Strided v[7]  # as _mla_to_cache's
    cdef bint rotate = positions != NULL
    if not (_tensor_view(k_pe, &v[1]) and _tensor_view(kv_c, &v[4]) and _tensor_view(slot_mapping, &v[5])
            and _tensor_view(kv_cache, &v[6])):
        return 0
    if rotate and not (q_pe != NULL and cos_sin_cache != NULL and _tensor_view(q_pe, &v[0])
                       and _tensor_view(cos_sin_cache, &v[2]) and _tensor_view(positions, &v[3])):
        return 0
    return _mla_to_cache(v, rotate, is_neox != 0)
