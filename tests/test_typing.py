"""Typing: the stubs match the compiled modules, and typed user code passes ``mypy --strict``."""

import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import posenc_fast as pf

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "typing_example.py"
PACKAGE = Path(pf.__file__).resolve().parent

needs_mypy = pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                reason="mypy is not installed")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "MYPY_FORCE_COLOR": "0"})


@needs_mypy
def test_example_passes_mypy_strict(tmp_path):
    result = _run("mypy", "--strict", "--cache-dir", str(tmp_path), str(EXAMPLE))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_mypy
def test_stubs_match_compiled_modules():
    modules = ["posenc_fast._cpu", "posenc_fast._core"] + [
        f"posenc_fast._isa_{name}" for name in ("avx2", "avx512", "avx512bf16")
        if importlib.util.find_spec(f"posenc_fast._isa_{name}")]
    result = _run("mypy.stubtest", *modules)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_example_uses_every_public_name():
    # its docstring says so (get_include and rotary_table_capsule were missing)
    import re

    used = set(re.findall(r"\bpf\.(\w+)", EXAMPLE.read_text()))
    assert set(pf.__all__) <= used, sorted(set(pf.__all__) - used)


def test_every_compiled_module_has_a_stub():
    compiled = [path for path in PACKAGE.iterdir() if path.suffix in (".so", ".pyd")]
    assert compiled
    for path in compiled:
        assert (PACKAGE / (path.name.split(".")[0] + ".pyi")).is_file(), path.name
    assert (PACKAGE / "py.typed").is_file()


def _public_callables():
    for name in pf.__all__:
        obj = getattr(pf, name)
        if inspect.isclass(obj):  # its methods and those of its compiled base classes
            members = {}
            for cls in reversed([c for c in obj.__mro__ if c.__module__.startswith("posenc_fast")]):
                members.update(vars(cls))
            for attr, member in members.items():
                if isinstance(member, classmethod):
                    yield f"{name}.{attr}", member.__func__
                elif inspect.isroutine(member) and (not attr.startswith("_") or attr == "__init__"):
                    yield f"{name}.{attr}", member
        elif callable(obj):
            yield name, obj


@pytest.mark.parametrize("name, function", list(_public_callables()))
def test_public_signatures_are_annotated(name, function):
    signature = inspect.signature(function)
    unannotated = [p.name for p in signature.parameters.values()
                   if p.annotation is inspect.Parameter.empty and p.name not in ("self", "cls")]
    assert not unannotated, f"{name}: parameters without a type: {unannotated}"
    assert signature.return_annotation is not inspect.Signature.empty, f"{name}: no return type"
