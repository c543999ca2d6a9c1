"""Load the kernel module built for the best instruction set of this CPU.

setup.py compiles ``_kernels.pxi`` once per variant (``baseline`` always;
``avx2`` and ``avx512`` on x86-64).  Every variant gives bitwise the same
results (no FMA contraction, no fast-math); the wider ones are only faster.
The environment variable ``POSENC_FAST_ISA`` (``baseline``, ``avx2``,
``avx512``) forces a variant, if it was built and the CPU supports it.
"""

import importlib
import os
import warnings
from types import ModuleType

from . import _cpu

ENV_VAR = "POSENC_FAST_ISA"
# Best first.
PREFERENCE = ("avx512", "avx2", "baseline")


def _built_variants() -> dict[str, ModuleType]:
    modules = {}
    for name in PREFERENCE:
        try:
            modules[name] = importlib.import_module(f"posenc_fast._kernels_{name}")
        except ImportError:
            pass
    return modules


def _choose(built: dict[str, ModuleType], supported: list[str]) -> str:
    usable = [name for name in PREFERENCE if name in built and name in supported]
    requested = os.environ.get(ENV_VAR, "").strip().lower()
    if requested:
        if requested in usable:
            return requested
        warnings.warn(f"{ENV_VAR}={requested!r} is not available here (usable: {usable}); "
                      f"using {usable[0]!r}", RuntimeWarning, stacklevel=3)
    return usable[0]


BUILT = _built_variants()
if "baseline" not in BUILT:
    raise ImportError("posenc_fast: the compiled kernels (_kernels_baseline) are missing; "
                      "reinstall with `pip install .`")
CPU_SUPPORTS = _cpu.cpu_supports()
ISA_IN_USE = _choose(BUILT, CPU_SUPPORTS)
kernels = BUILT[ISA_IN_USE]
