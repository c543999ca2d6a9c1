"""The C++ kernel of torch.ops.posenc_fast.rotary_embedding (posenc_fast._torch_kernel).

Built here into a temporary cache folder and checked in a process of its own
(tests/torch_kernel_cases.py): a kernel registered with torch stays for the
process.  Skipped without torch or a C++ compiler.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from posenc_fast import _torch_kernel

CASES = Path(__file__).with_name("torch_kernel_cases.py")


def fake_torch(version="2.13.0", abi=True):
    return SimpleNamespace(__version__=version, _C=SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=abi))


def test_the_library_is_named_by_torch_and_the_sources(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = _torch_kernel.library_path(fake_torch())
    assert path.parent == tmp_path / "posenc_fast" and path.suffix == ".so"
    assert path == _torch_kernel.library_path(fake_torch())
    assert path != _torch_kernel.library_path(fake_torch("2.14.0"))
    assert path != _torch_kernel.library_path(fake_torch(abi=False))


def test_without_a_build_the_op_keeps_the_python_kernel(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path, reason = _torch_kernel.load(fake_torch())
    assert path is None and "python -m posenc_fast build-torch-kernel" in reason
    _torch_kernel.library_path(fake_torch()).parent.mkdir(parents=True)
    _torch_kernel.library_path(fake_torch()).write_bytes(b"")
    monkeypatch.setenv(_torch_kernel.ENV_VAR, "0")
    path, reason = _torch_kernel.load(fake_torch())
    assert path is None and f"{_torch_kernel.ENV_VAR}=0" in reason


def test_a_library_that_does_not_load_leaves_the_python_kernels(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = _torch_kernel.library_path(torch)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared library")
    loaded, reason = _torch_kernel.load(torch)
    assert loaded is None and reason.startswith(f"the Python kernels: {path} did not load")


def test_a_failing_compiler_is_a_clear_error(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(RuntimeError, match="building the torch kernel failed: false"):
        _torch_kernel.build(torch)
    assert not _torch_kernel.library_path(torch).exists()


def test_the_kernel_built_here_passes_its_cases(tmp_path):
    pytest.importorskip("torch")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    env.pop(_torch_kernel.ENV_VAR, None)
    built = subprocess.run([sys.executable, "-m", "posenc_fast", "build-torch-kernel"], env=env,
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)], env=env,
                         capture_output=True, text=True, cwd=CASES.parent.parent)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
