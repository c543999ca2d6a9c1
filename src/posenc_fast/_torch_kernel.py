"""The C++ kernel of ``torch.ops.posenc_fast.rotary_embedding``: built on this machine, loaded by `torch_ops`.

torch calls an op's kernel written in Python for ~2.4 us however little it
does, one written in C++ for ~1.7 us; a decode step's rotation takes 6-7 us
(bench/README.md).  The C++ kernel (``torch_kernel/posenc_torch_kernel.cpp``)
is compiled against the torch installed here, so it is built here:
``python -m posenc_fast build-torch-kernel`` (a C++ compiler, a few seconds)
writes it to `cache_folder`, under a name keyed by its source, torch's
version and the Python ABI, and `posenc_fast.torch_ops` loads it at import
where it finds it (``POSENC_FAST_TORCH_KERNEL=0``: never).  Without it the
op's kernel is the Python function.  Either way the results and the errors
are `posenc_fast.vllm.rotary_embedding`'s: the C++ kernel hands every call
that _core's entry does not take to that function.
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
    """Where the kernel for `torch` (the module) and this Python lies once built."""
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), HEADER.read_bytes(), torch.__version__.encode(),
                                     sys.implementation.cache_tag.encode(),
                                     str(torch._C._GLIBCXX_USE_CXX11_ABI).encode()])).hexdigest()[:16]
    return cache_folder() / f"torch_kernel-{key}.so"


def build(torch) -> Path:
    """Compile the kernel for `torch` with ``$CXX`` (``c++`` without it); return its path.

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
    """Load the kernel built for `torch`, if there is one: (its path or None, why)."""
    if os.environ.get(ENV_VAR) == "0":
        return None, f"the Python kernel: turned off ({ENV_VAR}=0)"
    path = library_path(torch)
    if not path.exists():
        return None, (f"the Python kernel: none built for torch {torch.__version__} "
                      "(python -m posenc_fast build-torch-kernel)")
    torch.ops.load_library(str(path))
    address, version = kernels.torch_kernel_entry()
    if not ctypes.CDLL(str(path)).posenc_torch_kernel_set_entry(ctypes.c_void_p(address), version):
        return path, "loaded, but of another entry version: every call takes the Python kernel"
    return path, f"the C++ kernel: {path}"
