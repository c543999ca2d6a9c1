# The body of every _isa_<variant>.pyx: csrc/posenc_kernels.h compiled with
# that variant's instruction-set flags (setup.py), lent to _core as a capsule.
# Import such a module only on a CPU that has its instructions (_dispatch.py):
# its code may use them anywhere, even in its module init.
from cpython.pycapsule cimport PyCapsule_New

from posenc_fast._kernel_table cimport posenc_kernels

KERNELS = PyCapsule_New(<void*>&posenc_kernels, b"posenc_fast.kernel_table", NULL)
