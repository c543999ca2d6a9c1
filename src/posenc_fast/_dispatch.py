"""Choose the row kernels for this CPU, then load only those.

``_core`` (compiled once, portable flags) carries the baseline kernels.
setup.py also compiles them into ``_isa_avx2`` (and, opt-in,
``_isa_avx512``) with wider instruction sets.  This module asks the CPU
what it supports (``_cpu``, portable) before importing any variant: a
variant's module may use its instructions anywhere, its init included, so
importing it on a CPU without them would kill the interpreter.  Every
variant gives bitwise the same results; the wider ones are only faster.
The environment variable ``POSENC_FAST_ISA`` (``baseline``, ``avx2``,
``avx512``) forces a variant, if it was built and the CPU supports it.
"""

import importlib
import importlib.util
import os
import warnings

import ml_dtypes
import numpy as np

from . import _core, _cpu

ENV_VAR = "POSENC_FAST_ISA"
# Best first.
PREFERENCE = ("avx512", "avx2", "baseline")


def _built(name: str) -> bool:
    # Looks for the module file without executing it.
    return name == "baseline" or importlib.util.find_spec(f"posenc_fast._isa_{name}") is not None


def _choose(built: list[str], supported: list[str]) -> str:
    usable = [name for name in PREFERENCE if name in built and name in supported]
    requested = os.environ.get(ENV_VAR, "").strip().lower()
    if requested:
        if requested in usable:
            return requested
        warnings.warn(f"{ENV_VAR}={requested!r} is not available here (usable: {usable}); "
                      f"using {usable[0]!r}", RuntimeWarning, stacklevel=3)
    return usable[0]


BUILT = [name for name in PREFERENCE if _built(name)]
CPU_SUPPORTS = _cpu.cpu_supports()
ISA_IN_USE = _choose(BUILT, CPU_SUPPORTS)
if ISA_IN_USE != "baseline":
    _core.use_kernels(importlib.import_module(f"posenc_fast._isa_{ISA_IN_USE}").KERNELS)
_core.set_bfloat16_typenum(np.dtype(ml_dtypes.bfloat16).num)
kernels = _core
