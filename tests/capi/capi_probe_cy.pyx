# cython: language_level=3
"""The Cython twin of capi_probe_c.c (same functions, same arguments), through
``cimport posenc_fast.capi``; every call runs without the GIL."""

from libc.stdint cimport int64_t, uintptr_t

cimport posenc_fast.capi as pf

pf.import_posenc_fast()


def rotate(int dtype, uintptr_t x, uintptr_t out, int64_t outer, int64_t seq, int64_t inner,
           int64_t dim, uintptr_t positions, int64_t offset, int table_dtype, uintptr_t cos,
           uintptr_t sin, int64_t rows, int64_t stride, int64_t npairs, int layout, int inverse):
    cdef pf.posenc_fast_rows r
    cdef pf.posenc_fast_cos_sin t
    cdef int status
    r.dtype, r.x, r.out = <pf.posenc_fast_dtype>dtype, <const void*>x, <void*>out
    r.outer, r.seq, r.inner, r.dim = outer, seq, inner, dim
    r.positions, r.offset = <const int64_t*>positions, offset
    t.dtype, t.cos, t.sin = <pf.posenc_fast_dtype>table_dtype, <const void*>cos, <const void*>sin
    t.rows, t.stride, t.npairs = rows, stride, npairs
    with nogil:
        status = pf.posenc_fast_API.rotate(&r, &t, <pf.posenc_fast_layout>layout, inverse)
    return status


def rotate_rotary(capsule, int dtype, uintptr_t x, uintptr_t out, int64_t outer, int64_t seq,
                  int64_t inner, int64_t dim, uintptr_t positions, int64_t offset, int inverse):
    cdef const pf.posenc_fast_rotary* rotary = NULL
    cdef pf.posenc_fast_rows r
    cdef int status
    r.dtype, r.x, r.out = <pf.posenc_fast_dtype>dtype, <const void*>x, <void*>out
    r.outer, r.seq, r.inner, r.dim = outer, seq, inner, dim
    r.positions, r.offset = <const int64_t*>positions, offset
    if capsule is not None:
        rotary = pf.rotary_from_capsule(capsule)
    with nogil:
        status = pf.posenc_fast_API.rotate_rotary(&r, rotary, inverse)
    return status


def fill_cos_sin(int dtype, uintptr_t cos, uintptr_t sin, int64_t stride, uintptr_t positions,
                 int64_t n, uintptr_t freqs, int64_t npairs, double scale):
    cdef int status
    with nogil:
        status = pf.posenc_fast_API.fill_cos_sin(
            <pf.posenc_fast_dtype>dtype, <void*>cos, <void*>sin, stride,
            <const double*>positions, n, <const double*>freqs, npairs, scale)
    return status


def fill_sinusoidal(int dtype, uintptr_t out, uintptr_t positions, int64_t n, int64_t dim,
                    double base, int layout):
    cdef int status
    with nogil:
        status = pf.posenc_fast_API.fill_sinusoidal(
            <pf.posenc_fast_dtype>dtype, <void*>out, <const double*>positions, n, dim, base,
            <pf.posenc_fast_layout>layout)
    return status


def add_alibi(int dtype, uintptr_t scores, uintptr_t out, int64_t batch, int64_t heads,
              int64_t q_len, int64_t k_len, uintptr_t slopes, int64_t offset, int causal):
    cdef int status
    with nogil:
        status = pf.posenc_fast_API.add_alibi(
            <pf.posenc_fast_dtype>dtype, <const void*>scores, <void*>out, batch, heads, q_len,
            k_len, <const double*>slopes, offset, causal)
    return status


def status_message(int status):
    return pf.posenc_fast_API.status_message(status).decode()


def import_version(unsigned int version):
    pf.posenc_fast_import_version(version)
