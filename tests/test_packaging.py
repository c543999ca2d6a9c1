"""Packaging: sdist and wheel build, the sdist builds from scratch, the wheel installs clean
and passes the test suite with no source tree on the path.

Slow (minutes: it compiles every kernel variant in an isolated build
environment and installs into a fresh venv), so it runs only with
``POSENC_FAST_TEST_PACKAGING=1``.  Prints the time of each step.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("POSENC_FAST_TEST_PACKAGING") != "1",
                       reason="set POSENC_FAST_TEST_PACKAGING=1 to build and install (minutes)"),
    pytest.mark.skipif(importlib.util.find_spec("build") is None,
                       reason="the 'build' package is not installed"),
]


def _version() -> str:
    text = (ROOT / "src" / "posenc_fast" / "_version.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


def _step(name: str, command: list, cwd: Path, timings: dict) -> str:
    start = time.perf_counter()
    # PYTHONPATH would put the source tree on the path; the point is to use none
    # (and the test suite run below must not start this test again).
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "POSENC_FAST_TEST_PACKAGING")}
    result = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=1800)
    timings[name] = time.perf_counter() - start
    assert result.returncode == 0, (f"{name} failed:\n{result.stdout[-4000:]}\n"
                                    f"{result.stderr[-4000:]}")
    return result.stdout


@pytest.fixture
def timings():
    steps: dict[str, float] = {}
    yield steps
    print("\npackaging timings:")
    for name, seconds in steps.items():
        print(f"  {name:30} {seconds:7.1f} s")


def test_build_sdist_and_wheel_then_install_in_a_fresh_venv(tmp_path, timings):
    dist = tmp_path / "dist"
    version = _version()
    # With no --sdist/--wheel, build makes the sdist and then the wheel *from
    # the sdist*: the sdist must hold everything a build from scratch needs.
    _step("build sdist + wheel from it", [sys.executable, "-m", "build", "--outdir", dist, ROOT],
          tmp_path, timings)
    sdist = dist / f"posenc_fast-{version}.tar.gz"
    wheels = list(dist.glob(f"posenc_fast-{version}-*.whl"))
    assert sdist.is_file() and len(wheels) == 1, sorted(p.name for p in dist.iterdir())

    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for needed in ("pyproject.toml", "setup.py", "README.md", "src/posenc_fast/_core.pyx",
                   "src/posenc_fast/_kernel_table.pxd.tp", "src/posenc_fast/_isa_avx2.pyx",
                   "src/posenc_fast/csrc/posenc_kernels.h.tp",
                   "src/posenc_fast/csrc/kernel_types.py", "src/posenc_fast/_cpu.pyx",
                   "src/posenc_fast/_cpu.pyi", "src/posenc_fast/py.typed",
                   "src/posenc_fast/reference.py", "tests/test_cli.py",
                   "tests/capi/capi_probe_c.c", "tests/capi/capi_probe_cy.pyx",
                   "src/posenc_fast/include/posenc_fast.h",
                   "src/posenc_fast/torch_kernel/posenc_torch_kernel.cpp",
                   "examples/typing_example.py"):
        assert needed in names, f"sdist lacks {needed}"
    assert not [n for n in names if n.endswith((".so", ".pyd")) or n.startswith("build/")]
    # What setup.py renders from a template is rendered again from the sdist's.
    rendered = {n[:-len(".tp")] for n in names if n.endswith(".tp")}
    assert rendered and not rendered & names, sorted(rendered & names)

    with zipfile.ZipFile(wheels[0]) as archive:
        files = set(archive.namelist())
    assert "posenc_fast/py.typed" in files and "posenc_fast/_core.pyi" in files
    assert any(re.match(r"posenc_fast/_core\..*(so|pyd)$", f) for f in files)
    # The C API's header and Cython declarations ship (get_include), and the torch kernel's source
    # (built where it runs: build-torch-kernel); no other source does.
    api = {"posenc_fast/include/posenc_fast.h", "posenc_fast/include/posenc_fast/capi.pxd",
           "posenc_fast/include/posenc_fast/__init__.pxd", "posenc_fast/torch_kernel/posenc_torch_kernel.h",
           "posenc_fast/torch_kernel/posenc_torch_kernel.cpp"}
    assert api <= files
    assert not [f for f in files - api if f.endswith((".pyx", ".pxi", ".pxd", ".c", ".h", ".tp"))]

    venv = tmp_path / "venv"
    _step("create venv", [sys.executable, "-m", "venv", venv], tmp_path, timings)
    python = venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    _step("pip install wheel[test]", [python, "-m", "pip", "install", "--quiet",
                                      f"{wheels[0]}[test]"], tmp_path, timings)
    # Run from an empty folder: only the installed package can be imported.
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _step("import", [python, "-c", "import posenc_fast as pf; "
                             "print(pf.__version__); print(pf.__file__)"], work, timings)
    assert where.splitlines()[0] == version
    assert str(venv) in where.splitlines()[1]
    _step("posenc_fast info", [python, "-m", "posenc_fast", "info"], work, timings)
    out = _step("posenc_fast check", [python, "-m", "posenc_fast", "check"], work, timings)
    assert re.fullmatch(r"\d+ passed, 0 failed", out.strip().splitlines()[-1]), out
    # The test suite against the installed wheel: copies of tests/ and
    # examples/ beside no source tree.
    shutil.copytree(ROOT / "tests", work / "tests",
                    ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    shutil.copytree(ROOT / "examples", work / "examples")
    out = _step("pytest tests (installed wheel)",
                [python, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"], work, timings)
    assert re.search(r"\d+ passed", out) and " failed" not in out, out[-2000:]
