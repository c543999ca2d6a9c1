"""Choose the row kernels for this CPU, then load only those.

``_core`` (compiled once, portable flags) carries the baseline kernels.
setup.py also compiles them into ``_isa_avx2`` and ``_isa_avx512`` with
wider instruction sets.  This module asks the CPU what it supports
(``_cpu``, portable) before importing any variant: a variant's module may
use its instructions anywhere, its init included, so importing it on a CPU
without them would kill the interpreter.  Every variant gives bitwise the
same results; the wider ones are only faster, and AVX-512 not on every CPU
that has it (`prefer_avx512`).  The environment variable ``POSENC_FAST_ISA``
(``baseline``, ``avx2``, ``avx512``) forces a variant, if it was built and
the CPU supports it.
"""

import importlib
import importlib.util
import os
import warnings

import ml_dtypes
import numpy as np

from . import _core, _cpu

ENV_VAR = "POSENC_FAST_ISA"
# Widest first.
PREFERENCE = ("avx512", "avx2", "baseline")


def prefer_avx512(vendor: str, family: int, model: int) -> tuple[bool, str]:
    """Whether the AVX-512 kernels beat the AVX2 ones on this CPU, and why.

    Parameters
    ----------
    vendor, family, model
        ``_cpu.cpu_identity()``: the CPUID vendor string, display family and model.

    Returns
    -------
    (bool, str)
        True where AVX-512 was measured faster; the reason in words.

    Notes
    -----
    Measured (``bench/bench_isa.py``, one thread, medians of interleaved
    ratios) on AMD EPYC Zen 5 (family 0x1A), avx512 / avx2: W1 from memory
    0.81-0.96 (in place 0.95-0.96 with the aligned head), in cache 0.83-1.04,
    W3 0.69-0.88, apply_qk 0.83-0.91, add_alibi 0.65-0.92, tables 0.92-1.03,
    half rows 0.96-1.01.
    Zen 4 (family 0x19) runs 512-bit operations as two 256-bit halves, so
    the loops bound by the core gain little there; Intel Skylake-SP and
    Cascade Lake (family 6, model 0x55) lower the clock for 512-bit
    floating-point work, also for the other cores' code; later Intel cores
    were not measured.  Those stay on AVX2 until a measurement says otherwise.
    """
    if vendor == "AuthenticAMD" and family >= 0x1A:
        return True, "measured faster on AMD Zen 5 and later"
    if vendor == "AuthenticAMD" and family == 0x19:
        return False, "AMD Zen 4 runs 512-bit operations as two 256-bit halves"
    if vendor == "GenuineIntel" and family == 6 and model == 0x55:
        return False, "Intel Skylake-SP/Cascade Lake lower the clock for 512-bit work"
    return False, "not measured faster on this CPU"


def choose(built: list[str], supported: list[str], requested: str,
           cpu: tuple[str, int, int]) -> tuple[str, str]:
    """Return (variant, reason): the variant to load and why.

    Parameters
    ----------
    built, supported : list of str
        The variants compiled, and those the CPU can run.
    requested : str
        ``POSENC_FAST_ISA`` ("" when unset); a request that is not usable
        here warns and falls back to the automatic choice.
    cpu : (vendor, family, model)
        As ``_cpu.cpu_identity()`` returns them, for `prefer_avx512`.
    """
    usable = [name for name in PREFERENCE if name in built and name in supported]
    requested = requested.strip().lower()
    if requested in usable:
        return requested, f"forced by {ENV_VAR}={requested}"
    if requested:
        warnings.warn(f"{ENV_VAR}={requested!r} is not available here (usable: {usable}); "
                      "choosing as if unset", RuntimeWarning, stacklevel=3)
    if "avx512" in usable:
        if "avx2" not in usable:
            return "avx512", "avx512: supported; avx2 not built"
        faster, why = prefer_avx512(*cpu)
        if faster:
            return "avx512", f"avx512: supported, {why}"
        return "avx2", f"avx2: avx512 supported but {why}"
    best = usable[0]
    wider = PREFERENCE[:PREFERENCE.index(best)]
    return best, f"{best}: " + "; ".join(
        f"{name} not built" if name not in built else f"{name} not supported by the CPU (or its OS)"
        for name in wider)


BUILT = [name for name in PREFERENCE
         if name == "baseline" or importlib.util.find_spec(f"posenc_fast._isa_{name}")]
CPU_SUPPORTS = _cpu.cpu_supports()
ISA_IN_USE, ISA_REASON = choose(BUILT, CPU_SUPPORTS, os.environ.get(ENV_VAR, ""),
                                _cpu.cpu_identity())
if ISA_IN_USE != "baseline":
    _core.use_kernels(importlib.import_module(f"posenc_fast._isa_{ISA_IN_USE}").KERNELS)
_core.set_bfloat16_typenum(np.dtype(ml_dtypes.bfloat16).num)
kernels = _core
