/* NumPy 2's descriptor accessors, which Cython's numpy declarations use,
   for a build against NumPy 1 headers (e.g. a distribution's NumPy 1.24
   on aarch64): the module is built against NumPy 2 everywhere else. */
#ifndef POSENC_NUMPY_COMPAT_H
#define POSENC_NUMPY_COMPAT_H
#include <numpy/ndarraytypes.h>
#if NPY_ABI_VERSION < 0x02000000
#define PyDataType_ELSIZE(descr) ((descr)->elsize)
#define PyDataType_FLAGS(descr) ((descr)->flags)
#endif
#endif
