"""Build the Cython extensions of posenc_fast.

Metadata lives in pyproject.toml; this file only lists the extensions and
their flags.

* Every ``src/posenc_fast/*.pyx`` becomes an extension module.
* ``csrc/posenc_kernels.h``, ``posenc_vectors.h``, ``posenc_position.h``,
  ``posenc_norm.h`` and ``posenc_tables.h`` are generated from their Tempita templates over the
  dtypes of ``csrc/kernel_types.py`` (the row kernels of every dtype and the
  table of function pointers to them), and ``_kernel_table.pxd`` (_core's
  declarations of that table) from its template over the same names, before
  cythonize.
* The row kernels are compiled once per instruction set: into ``_core`` (the
  module compiled once, with the compiler's portable default) and on x86-64
  into ``_isa_avx2`` (``-mavx2 -mf16c``), ``_isa_avx512`` and
  ``_isa_avx512bf16`` (AVX-512 with AVX512_BF16's bfloat16 rounding), each
  where the compiler accepts its flags (an older compiler builds without it).  The
  package asks the CPU first and imports only a variant it supports
  (``posenc_fast._dispatch``, which also decides where AVX-512 is worth it),
  so a wheel never executes an instruction the machine lacks.  No variant enables FMA: with ``-ffp-contract=off`` GCC
  still fused alternating -/+ into vfmaddsub, and every variant must round
  as the baseline does.
* Large calls run on the thread pool of ``csrc/posenc_pool.h`` (pthreads,
  no OpenMP: a caller never waits for a worker that has no core).

Environment variables (build time):

``POSENC_FAST_NATIVE=1``
    add ``-march=native`` to the baseline build (not distributable).
``POSENC_FAST_ISA_VARIANTS=baseline``
    comma list of variants to build (default: baseline,avx2,avx512,avx512bf16; baseline
    is always built, into ``_core``).
``POSENC_FAST_DEBUG=1``
    turn Cython bounds checks on and build with ``-O0 -g``.
``POSENC_FAST_SANITIZE=address,undefined``
    build with ``-fsanitize=...`` (see README, development section).
``CFLAGS=-DPOSENC_PREFETCH_DISTANCE=4096`` (setuptools adds CFLAGS to every compile)
    set a tuning constant of ``csrc/posenc_config.h`` (``bench/sweep.py``).
"""

import os
import platform
import runpy
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
from Cython import Tempita
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
PKG = Path("src") / "posenc_fast"
CSRC = PKG / "csrc"

ISA_FLAGS = {
    "baseline": [],
    "avx2": ["-mavx2", "-mf16c"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mf16c"],
}
ISA_FLAGS["avx512bf16"] = ISA_FLAGS["avx512"] + ["-mavx512bf16"]
DEFAULT_VARIANTS = ("baseline", "avx2", "avx512", "avx512bf16")
ON_X86_64 = platform.machine().lower() in ("x86_64", "amd64")
DEBUG = os.environ.get("POSENC_FAST_DEBUG", "") not in ("", "0")
SANITIZE = os.environ.get("POSENC_FAST_SANITIZE", "")


def _compiler() -> str:
    return os.environ.get("CC") or sysconfig.get_config_var("CC").split()[0]


def _probe(source: str, flags: list[str]) -> bool:
    """Return True if `source` compiles and links with `flags`."""
    cc = _compiler()
    if shutil.which(cc) is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        exe = Path(tmp) / "probe"
        src.write_text(source)
        try:
            built = subprocess.run([cc, *flags, str(src), "-o", str(exe)],
                                   capture_output=True, timeout=60)
            return built.returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False


def _isa_variants() -> list[str]:
    wanted = os.environ.get("POSENC_FAST_ISA_VARIANTS", "")
    names = [n.strip() for n in wanted.split(",") if n.strip()] or list(DEFAULT_VARIANTS)
    unknown = set(names) - set(ISA_FLAGS)
    if unknown:
        raise SystemExit(f"POSENC_FAST_ISA_VARIANTS: unknown variant(s) {sorted(unknown)}; "
                         f"expected some of {list(ISA_FLAGS)}")
    if "baseline" not in names:
        names.insert(0, "baseline")
    if not ON_X86_64 or sys.platform == "win32":
        return ["baseline"]
    return [n for n in names if n == "baseline" or _probe("int main(void){return 0;}\n", ISA_FLAGS[n])]


def _generate_sources() -> None:
    """Render every ``csrc/*.tp`` and ``posenc_fast/*.tp`` template (Tempita, names from
    ``csrc/kernel_types.py``) into the file it names, if changed."""
    namespace = {name: value for name, value in
                 runpy.run_path(str(HERE / CSRC / "kernel_types.py")).items()
                 if not name.startswith("__")}
    for template in sorted([*(HERE / CSRC).glob("*.tp"), *(HERE / PKG).glob("*.tp")]):
        text = Tempita.sub(template.read_text(), **namespace)
        target = template.with_suffix("")
        if not target.exists() or target.read_text() != text:
            target.write_text(text)


def _extensions() -> list[Extension]:
    threads = [] if sys.platform == "win32" else ["-pthread"]
    common = ["-O0", "-g"] if DEBUG else ["-O3"]
    # Same results on every ISA: no contraction into FMA, no fast-math.
    common += ["-ffp-contract=off", "-fno-math-errno", "-Wno-unused-function"]
    link = list(threads)
    if SANITIZE:
        common += [f"-fsanitize={SANITIZE}", "-fno-omit-frame-pointer"]
        link += [f"-fsanitize={SANITIZE}"]
    native = os.environ.get("POSENC_FAST_NATIVE", "") not in ("", "0")
    macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
    kernel_macros = macros + [("POSENC_DEFINE_KERNELS", "1")]

    # Cython follows the .pxd/.pxi a module cimports, not the C headers they include: a changed
    # header (a rendered template) must rebuild every module, or a stale kernel table stays built.
    headers = [str(folder / header.name) for folder in (CSRC, PKG / "torch_kernel")
               for header in sorted((HERE / folder).glob("*.h"))]

    def ext(name: str, isa: list[str] = (), kernels: bool = False) -> Extension:
        return Extension(f"posenc_fast.{name}", [str(PKG / f"{name}.pyx")], depends=headers,
                         include_dirs=[np.get_include(), str(CSRC), str(PKG / "include")],
                         define_macros=kernel_macros if kernels else macros,
                         extra_compile_args=[*common, *threads, *isa], extra_link_args=link)

    exts = [ext("_core", ["-march=native"] if native else [], kernels=True)]
    for variant in _isa_variants():
        if variant != "baseline":
            exts.append(ext(f"_isa_{variant}", ISA_FLAGS[variant], kernels=True))
    for pyx in sorted((HERE / PKG).glob("*.pyx")):
        if not pyx.stem.startswith(("_isa_", "_core")):
            exts.append(ext(pyx.stem))
    return exts


directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": False,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
}


class BuildExt(build_ext):
    """build_ext compiling the extensions side by side, one per core, unless told otherwise (-j)."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1


_generate_sources()
setup(ext_modules=cythonize(_extensions(), compiler_directives=directives, compile_time_env={},
                            quiet=True, nthreads=os.cpu_count() or 1),
      cmdclass={"build_ext": BuildExt})
