"""The C++ kernels of the in-place torch ops and of hf_rotate: built on this machine, loaded by `torch_ops`.

torch calls an op's kernel written in Python for ~2.4 us however little it
does, one written in C++ for ~1.7 us; a decode step's rotation takes 6-7 us
(bench/README.md).  ``torch_kernel/posenc_torch_kernel.cpp`` holds the CPU
kernels of ``torch.ops.posenc_fast.rotary_embedding``,
``apply_qk_to_cache``, ``fused_qk_norm_rope``, ``concat_and_cache_mla``,
``concat_and_cache_mla_rope_fused``, ``hf_rotate`` and ``_hf_rotate_no_grad``
(the per-token ops of a decode step), compiled against
the torch installed here, so built here: ``python -m posenc_fast
build-torch-kernel`` (a C++ compiler, a few seconds) writes them to
`cache_folder`, under a name keyed by their source, torch's version and the
Python ABI, and `posenc_fast.torch_ops` loads them at import where it finds
them (``POSENC_FAST_TORCH_KERNEL=0``: never).  Without them the ops' kernels
are the Python functions.  Either way the results and the errors are
`posenc_fast.vllm`'s: a C++ kernel hands every call that _core's entry does
not take to the function.
"""

import ctypes
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from ._dispatch import cache_folder, kernels

ENV_VAR = "POSENC_FAST_TORCH_KERNEL"
SOURCE = Path(__file__).resolve().parent / "torch_kernel" / "posenc_torch_kernel.cpp"
HEADER = SOURCE.with_suffix(".h")


def library_path(torch) -> Path:
    """Where the kernels for `torch` (the module) and this Python lie once built."""
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), HEADER.read_bytes(), torch.__version__.encode(),
                                     sys.implementation.cache_tag.encode(),
                                     str(torch._C._GLIBCXX_USE_CXX11_ABI).encode()])).hexdigest()[:16]
    return cache_folder() / f"torch_kernel-{key}.so"


def build(torch) -> Path:
    """Compile the kernels for `torch` with ``$CXX`` (``c++`` without it); return its path.

    Raises
    ------
    RuntimeError
        If the compiler fails (its command and messages).
    """
    from torch.utils import cpp_extension

    path = library_path(torch)
    path.parent.mkdir(parents=True, exist_ok=True)
    built = path.with_name(f"{path.name}.{os.getpid()}")
    command = [os.environ.get("CXX", "c++"), "-O2", "-std=c++17", "-shared", "-fPIC",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               *(f"-I{folder}" for folder in cpp_extension.include_paths()), f"-I{HEADER.parent}",
               str(SOURCE), *(f"-L{folder}" for folder in cpp_extension.library_paths()),
               "-lc10", "-ltorch_cpu", "-o", str(built)]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as error:
        raise RuntimeError(f"building the torch kernel failed: {' '.join(command)}: {error}") from None
    if result.returncode:
        raise RuntimeError(f"building the torch kernel failed: {' '.join(command)}\n{result.stderr[-4000:]}")
    os.replace(built, path)  # whole or not at all, for a process loading it meanwhile
    return path


def load(torch) -> tuple[Path | None, str]:
    """Load the kernels built for `torch`, if there are: (their library's path or None, why)."""
    if os.environ.get(ENV_VAR) == "0":
        return None, f"the Python kernels: turned off ({ENV_VAR}=0)"
    path = library_path(torch)
    if not path.exists():
        return None, (f"the Python kernels: none built for torch {torch.__version__} "
                      "(python -m posenc_fast build-torch-kernel)")
    try:
        torch.ops.load_library(str(path))
    except OSError as error:  # e.g. built against another build of this torch version
        return None, f"the Python kernels: {path} did not load ({error}); build it again"
    address, version = kernels.torch_kernel_entry()
    if not ctypes.CDLL(str(path)).posenc_torch_kernel_set_entries(ctypes.c_void_p(address), version):
        return path, "loaded, but of another entry version: every call takes the Python kernels"
    return path, f"the C++ kernels: {path}"
