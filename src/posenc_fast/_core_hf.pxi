# The transformers drop-ins' common call on CPU tensors, every check in C:
# `TensorRotation` (the eager drop-ins, posenc_fast._hf_drop_in.compiled), and
# `_torch_hf_rotate`, the compiled torch kernel's entry of the ops `hf_rotate`
# and `_hf_rotate_no_grad` (what a torch.compile graph calls for them), which
# finds its function's rotation by the ops' (family, name) among those
# `register_hf_rotation` named.

from libc.string cimport memset

cdef extern from *:
    """
    /* the registry's count, published after its entry (a C++ kernel may read it on another thread) */
    static inline void posenc_publish(int* at, int value) { __atomic_store_n(at, value, __ATOMIC_RELEASE); }
    static inline int posenc_published(const int* at) { return __atomic_load_n(at, __ATOMIC_ACQUIRE); }
    """
    void posenc_publish(int* at, int value) nogil
    int posenc_published(const int* at) nogil


cdef enum:
    CACHE_HALVES, CACHE_HALF_WIDTH
    HF_ROTATIONS = 256   # named rotations the registry holds (install's tables name fewer)
    HF_NAME_BYTES = 64


cdef struct RotationSpec:
    # A TensorRotation's parameters (see its docstring).
    int cache, ntensors
    bint half, partial, trailing, inverse
    unsigned char dtypes[POSENC_NUM_DTYPES * POSENC_NUM_DTYPES * POSENC_NUM_DTYPES]


cdef struct RotationCall:
    # A call: the data (n, one or two), cos and sin as read; as _rotation_plan checked it, each data's
    # walk over cos/sin and dtype index, the cache's dtype index, the features per row and rotated.
    Strided v[4]
    Py_ssize_t n
    CacheWalk walks[2]
    int d[2]
    int table
    Py_ssize_t dim, rotated


cdef bint _rotation_plan(const RotationSpec* spec, RotationCall* r, Py_ssize_t unsqueeze_dim) noexcept nogil:
    # Whether `spec` takes the call r.v (the function's result is the kernel's), and its walks.
    cdef Py_ssize_t j, cnd, axis, k, width, rows, itemsize
    cdef cnp.npy_intp dims[STRIDED_AXES]
    cdef cnp.npy_intp cos_steps[STRIDED_AXES]
    cdef cnp.npy_intp sin_steps[STRIDED_AXES]
    cdef Strided* c = &r.v[2]
    cdef Strided* s = &r.v[3]
    itemsize = c.itemsize
    r.table = posenc_dtype_index(c.type_num)
    cnd = c.nd
    if (r.n < 1 or r.n > spec.ntensors or s.type_num != c.type_num or s.nd != cnd or cnd < 1 or cnd + 1 > STRIDED_AXES
            or memcmp(s.dims, c.dims, cnd * sizeof(cnp.npy_intp)) or not -cnd - 1 <= unsqueeze_dim <= cnd):
        return False
    # cos and sin unsqueezed at unsqueeze_dim, one entry per pair (dims, steps)
    axis = unsqueeze_dim + cnd + 1 if unsqueeze_dim < 0 else unsqueeze_dim
    if axis == cnd:  # the heads axis last: cos's last axis is then no longer its pairs
        return False
    width = c.dims[cnd - 1]
    if spec.cache == CACHE_HALVES and width % 2:
        return False
    rows = _count(c) // width if width else 0  # cos's rows, and sin's (the same shape)
    if spec.cache == CACHE_HALVES and spec.half and not (
            _contiguous(c) and _contiguous(s) and _rows_repeat(c.data, rows, width, itemsize, False)
            and _rows_repeat(s.data, rows, width, itemsize, False)):
        return False  # halves that differ (the formula then rotates no pairs) or unread here
    for k in range(cnd + 1):
        j = k if k < axis else k - 1
        dims[k] = 1 if k == axis else c.dims[j]
        cos_steps[k] = 0 if k == axis else c.steps[j]
        sin_steps[k] = 0 if k == axis else s.steps[j]
    if spec.cache == CACHE_HALVES:
        dims[cnd] = width // 2
    if (<Py_ssize_t>c.data % itemsize or <Py_ssize_t>s.data % itemsize
            or dims[cnd] > 1 and (cos_steps[cnd] != itemsize or sin_steps[cnd] != itemsize)):
        return False  # as _fast_cache takes a cache
    r.rotated = 2 * dims[cnd]
    for j in range(r.n):
        if r.v[j].nd < 1 or not _contiguous(&r.v[j]):
            return False
        r.d[j] = posenc_dtype_index(r.v[j].type_num)
        r.dim = r.v[0].dims[r.v[0].nd - 1]
        if (r.d[j] < 0 or r.v[j].dims[r.v[j].nd - 1] != r.dim or r.dim < 2 or r.dim % 2
                or not (r.rotated == r.dim or spec.partial and 2 <= r.rotated <= r.dim)
                or r.table < 0 or K.rotate[r.d[j]][r.table][0] == NULL
                or not _walk_plan(r.v[j].nd, r.v[j].dims, cnd + 1, dims, cos_steps, sin_steps, itemsize,
                                  &r.walks[j])):
            return False
    return spec.dtypes[((r.d[0] * POSENC_NUM_DTYPES + r.d[r.n - 1]) * POSENC_NUM_DTYPES) + r.table] != 0


cdef void _rotation_run(const RotationSpec* spec, const RotationCall* r, char** outs) noexcept nogil:
    # A planned call's data rotated into outs (new, C-contiguous, of the data's shapes and dtypes).
    cdef CosSinTable cos_sin
    cdef Py_ssize_t j
    for j in range(r.n):
        cos_sin = _walk_table(r.v[2].data, r.v[3].data, &r.walks[j], r.v[2].itemsize, r.table)
        _walk_rows(r.v[j].data, outs[j], r.d[j], r.v[j].itemsize, r.dim, &cos_sin, &r.walks[j], spec.half,
                   spec.inverse, r.dim - r.rotated if spec.trailing else 0)


@cython.auto_pickle(False)
cdef class TensorRotation:
    """A transformers rotation function on CPU torch tensors, every check in C.

    Built by posenc_fast.hf from a `RotaryFunction` (its layout, cache form
    ``"halves"`` or ``"half_width"``, partial/trailing features, direction)
    and `dtypes`, 64 bytes: entry
    ``(q * 4 + k) * 4 + cache`` (kernel dtype indices; a one-tensor function's
    ``k`` is ``q``) is nonzero where the function's result is the kernel's;
    `ntensors`, 1 or 2, the most tensors it rotates (x, or q and k).
    Called with ``(xs, cos, sin, unsqueeze_dim)`` it returns the rotated
    tensors, new ones with xs's dtypes, or None, having written nothing, for
    a call it does not take: the Python layer then decides (and raises).
    """
    cdef RotationSpec spec

    def __init__(self, str layout, str cache, bint partial, bint trailing, bint inverse,
                 bytes dtypes, int ntensors):
        if len(dtypes) != POSENC_NUM_DTYPES ** 3:
            raise ValueError(f"dtypes must hold {POSENC_NUM_DTYPES ** 3} bytes, got {len(dtypes)}")
        if ntensors not in (1, 2):
            raise ValueError(f"ntensors must be 1 or 2, got {ntensors}")
        self.spec.ntensors = ntensors
        if cache not in ("halves", "half_width"):
            raise ValueError(f"cache must be 'halves' or 'half_width', got {cache!r}")
        self.spec.cache = CACHE_HALVES if cache == "halves" else CACHE_HALF_WIDTH
        self.spec.half, self.spec.partial, self.spec.trailing, self.spec.inverse = (layout == "half", partial,
                                                                                    trailing, inverse)
        memcpy(self.spec.dtypes, <const char*>dtypes, len(dtypes))

    def __call__(self, tuple xs, cos, sin, unsqueeze_dim):
        cdef RotationCall r
        cdef char* outs[2]
        cdef Py_ssize_t j
        cdef bint grad
        r.n = len(xs)
        if (not _fast_paths_on or _Tensor is None or r.n < 1 or r.n > 2 or type(unsqueeze_dim) is not int
                or not -STRIDED_AXES <= unsqueeze_dim <= STRIDED_AXES):
            return None
        grad = _grad_enabled() is True
        if not (_tensor_strided(cos, grad, True, &r.v[2]) and _tensor_strided(sin, grad, True, &r.v[3])):
            return None
        for j in range(r.n):
            if not _tensor_strided(xs[j], grad, True, &r.v[j]):
                return None
        if not _rotation_plan(&self.spec, &r, unsqueeze_dim):
            return None
        made = _new_output(&r.v[0], &outs[0])
        other = _new_output(&r.v[1], &outs[1]) if r.n == 2 else None
        with nogil:  # new outputs: nothing to overlap
            _rotation_run(&self.spec, &r, outs)
        return (made,) if r.n == 1 else (made, other)


cdef struct NamedRotation:
    char family[HF_NAME_BYTES]
    char name[HF_NAME_BYTES]
    RotationSpec spec


cdef NamedRotation _named[HF_ROTATIONS]
cdef int _named_count = 0


cdef const RotationSpec* _named_rotation(const char* family, Py_ssize_t family_len, const char* name,
                                         Py_ssize_t name_len) noexcept nogil:
    # The rotation registered as (family, name), or NULL.
    cdef int i, count = posenc_published(&_named_count)
    if family_len >= HF_NAME_BYTES or name_len >= HF_NAME_BYTES or family_len < 0 or name_len < 0:
        return NULL
    for i in range(count):
        if (memcmp(_named[i].family, family, family_len) == 0 and _named[i].family[family_len] == 0
                and memcmp(_named[i].name, name, name_len) == 0 and _named[i].name[name_len] == 0):
            return &_named[i].spec
    return NULL


def register_hf_rotation(str family, str name, TensorRotation rotation not None):
    """Name `rotation` as transformers.models.<family>'s `name`, for the compiled torch kernel of
    ``hf_rotate``: True, or False where the registry is full or a name too long (those calls keep
    the Python kernel).  A name registered once keeps its first rotation."""
    cdef bytes f = family.encode(), n = name.encode()
    cdef NamedRotation* entry
    if len(f) >= HF_NAME_BYTES or len(n) >= HF_NAME_BYTES:
        return False
    if _named_rotation(f, len(f), n, len(n)) != NULL:
        return True
    if _named_count == HF_ROTATIONS:
        return False
    entry = &_named[_named_count]
    memset(entry, 0, sizeof(NamedRotation))
    memcpy(entry.family, <const char*>f, len(f))
    memcpy(entry.name, <const char*>n, len(n))
    entry.spec = rotation.spec
    posenc_publish(&_named_count, _named_count + 1)
    return True


cdef int _torch_hf_rotate(const char* family, int64_t family_len, const char* name, int64_t name_len,
                          const posenc_tensor* xs, int n, const posenc_tensor* cos, const posenc_tensor* sin,
                          int64_t unsqueeze_dim, posenc_allocate_fn allocate, void* context) noexcept nogil:
    # posenc_hf_rotate_fn: TensorRotation's checks and call on the kernel's tensors, by the rotation
    # registered under (family, name); the outputs from `allocate`, once every check passed.
    cdef RotationCall r
    cdef char* outs[2]
    cdef Py_ssize_t j
    cdef const RotationSpec* spec = _named_rotation(family, family_len, name, name_len)
    r.n = n
    if (spec == NULL or not _fast_paths_on or n < 1 or n > 2 or not -STRIDED_AXES <= unsqueeze_dim <= STRIDED_AXES
            or not (_tensor_view(cos, &r.v[2]) and _tensor_view(sin, &r.v[3]))):
        return 0
    for j in range(n):
        if not _tensor_view(&xs[j], &r.v[j]):
            return 0
    if not _rotation_plan(spec, &r, unsqueeze_dim):
        return 0
    for j in range(n):
        outs[j] = <char*>allocate(context, <int>j)
        if outs[j] == NULL:
            return 0
    _rotation_run(spec, &r, outs)
    return 1


cdef posenc_torch_entries _TORCH_ENTRIES = posenc_torch_entries(_torch_rotate_tokens, _torch_tokens_to_cache,
                                                                _torch_norm_tokens, _torch_mla_to_cache,
                                                                _torch_hf_rotate)


def torch_kernel_entry():
    """(address, version) of the compiled torch kernel's entries (posenc_torch_kernel.h)."""
    return <Py_ssize_t><void*>&_TORCH_ENTRIES, POSENC_TORCH_ENTRY_VERSION
