/* A C extension over posenc_fast.h, built by the tests (test_capi.py) and
   bench/bench_capi.py.  Arrays come as addresses (arr.ctypes.data, 0 for
   NULL) so that the tests can pass any pointer and size; every call runs
   without the GIL and returns the posenc_fast_status. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include "posenc_fast.h"

#define PTR(a) ((void*)(uintptr_t)(a))

static PyObject* rotate(PyObject* self, PyObject* args) {
    posenc_fast_rows rows;
    posenc_fast_cos_sin table;
    unsigned long long x, out, positions, cos, sin;
    int dtype, table_dtype, layout, inverse, status;
    if (!PyArg_ParseTuple(args, "iKKLLLLKLiKKLLLii", &dtype, &x, &out, &rows.outer, &rows.seq,
                          &rows.inner, &rows.dim, &positions, &rows.offset, &table_dtype, &cos,
                          &sin, &table.rows, &table.stride, &table.npairs, &layout, &inverse))
        return NULL;
    rows.dtype = (posenc_fast_dtype)dtype;
    rows.x = PTR(x);
    rows.out = PTR(out);
    rows.positions = (const int64_t*)PTR(positions);
    table.dtype = (posenc_fast_dtype)table_dtype;
    table.cos = PTR(cos);
    table.sin = PTR(sin);
    Py_BEGIN_ALLOW_THREADS
    status = posenc_fast_API->rotate(&rows, &table, (posenc_fast_layout)layout, inverse);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

/* The table of a rotary_table_capsule, or NULL for None. */
static int rotary_of(PyObject* capsule, const posenc_fast_rotary** rotary) {
    *rotary = NULL;
    if (capsule == Py_None) return 0;
    *rotary = PyCapsule_GetPointer(capsule, POSENC_FAST_ROTARY_CAPSULE);
    return *rotary == NULL ? -1 : 0;
}

static PyObject* rotate_rotary(PyObject* self, PyObject* args) {
    posenc_fast_rows rows;
    const posenc_fast_rotary* rotary;
    PyObject* capsule;
    unsigned long long x, out, positions;
    int dtype, inverse, status;
    if (!PyArg_ParseTuple(args, "OiKKLLLLKLi", &capsule, &dtype, &x, &out, &rows.outer,
                          &rows.seq, &rows.inner, &rows.dim, &positions, &rows.offset, &inverse)
            || rotary_of(capsule, &rotary) < 0)
        return NULL;
    rows.dtype = (posenc_fast_dtype)dtype;
    rows.x = PTR(x);
    rows.out = PTR(out);
    rows.positions = (const int64_t*)PTR(positions);
    Py_BEGIN_ALLOW_THREADS
    status = posenc_fast_API->rotate_rotary(&rows, rotary, inverse);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

static PyObject* fill_cos_sin(PyObject* self, PyObject* args) {
    unsigned long long cos, sin, positions, freqs;
    long long stride, n, npairs;
    double scale;
    int dtype, status;
    if (!PyArg_ParseTuple(args, "iKKLKLKLd", &dtype, &cos, &sin, &stride, &positions, &n, &freqs,
                          &npairs, &scale))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = posenc_fast_API->fill_cos_sin((posenc_fast_dtype)dtype, PTR(cos), PTR(sin), stride,
                                           PTR(positions), n, PTR(freqs), npairs, scale);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

static PyObject* fill_sinusoidal(PyObject* self, PyObject* args) {
    unsigned long long out, positions;
    long long n, dim;
    double base;
    int dtype, layout, status;
    if (!PyArg_ParseTuple(args, "iKKLLdi", &dtype, &out, &positions, &n, &dim, &base, &layout))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = posenc_fast_API->fill_sinusoidal((posenc_fast_dtype)dtype, PTR(out), PTR(positions),
                                              n, dim, base, (posenc_fast_layout)layout);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

static PyObject* add_alibi(PyObject* self, PyObject* args) {
    unsigned long long scores, out, slopes;
    long long batch, heads, q_len, k_len, offset;
    int dtype, causal, status;
    if (!PyArg_ParseTuple(args, "iKKLLLLKLi", &dtype, &scores, &out, &batch, &heads, &q_len,
                          &k_len, &slopes, &offset, &causal))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = posenc_fast_API->add_alibi((posenc_fast_dtype)dtype, PTR(scores), PTR(out), batch,
                                        heads, q_len, k_len, PTR(slopes), offset, causal);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

static PyObject* status_message(PyObject* self, PyObject* args) {
    int status;
    if (!PyArg_ParseTuple(args, "i", &status)) return NULL;
    return PyUnicode_FromString(posenc_fast_API->status_message(status));
}

/* import_posenc_fast(), expecting ABI `version` (None on success). */
static PyObject* import_version(PyObject* self, PyObject* args) {
    unsigned int version;
    if (!PyArg_ParseTuple(args, "I", &version)) return NULL;
    if (posenc_fast_import_version(version) < 0) return NULL;
    Py_RETURN_NONE;
}

/* For the bench: `reps` one-token rotations (in rows of one position,
   `offset`), or `reps` memcpy of the same bytes, in a loop without the GIL;
   returns the last status (0 for memcpy). */
static PyObject* repeat_rotate_rotary(PyObject* self, PyObject* args) {
    posenc_fast_rows rows;
    const posenc_fast_rotary* rotary;
    PyObject* capsule;
    unsigned long long x, out;
    long long reps;
    int status = 0;
    if (!PyArg_ParseTuple(args, "OKKLLLLL", &capsule, &x, &out, &rows.outer, &rows.inner,
                          &rows.dim, &rows.offset, &reps)
            || rotary_of(capsule, &rotary) < 0)
        return NULL;
    rows.dtype = POSENC_FAST_FLOAT32;
    rows.x = PTR(x);
    rows.out = PTR(out);
    rows.seq = 1;
    rows.positions = NULL;
    Py_BEGIN_ALLOW_THREADS
    for (long long i = 0; i < reps; i++) {
        status = posenc_fast_API->rotate_rotary(&rows, rotary, 0);
        __asm__ volatile("" ::: "memory");
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

static PyObject* repeat_memcpy(PyObject* self, PyObject* args) {
    unsigned long long dst, src;
    long long nbytes, reps;
    if (!PyArg_ParseTuple(args, "KKLL", &dst, &src, &nbytes, &reps)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    for (long long i = 0; i < reps; i++) {
        memcpy(PTR(dst), PTR(src), (size_t)nbytes);
        __asm__ volatile("" ::: "memory");
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(0);
}

static PyMethodDef methods[] = {
    {"rotate", rotate, METH_VARARGS, NULL},
    {"rotate_rotary", rotate_rotary, METH_VARARGS, NULL},
    {"fill_cos_sin", fill_cos_sin, METH_VARARGS, NULL},
    {"fill_sinusoidal", fill_sinusoidal, METH_VARARGS, NULL},
    {"add_alibi", add_alibi, METH_VARARGS, NULL},
    {"status_message", status_message, METH_VARARGS, NULL},
    {"import_version", import_version, METH_VARARGS, NULL},
    {"repeat_rotate_rotary", repeat_rotate_rotary, METH_VARARGS, NULL},
    {"repeat_memcpy", repeat_memcpy, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "capi_probe_c", NULL, -1, methods};

PyMODINIT_FUNC PyInit_capi_probe_c(void) {
    if (import_posenc_fast() < 0) return NULL;
    return PyModule_Create(&module);
}
