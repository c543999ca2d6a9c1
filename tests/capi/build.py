"""Build the probe extensions over posenc_fast's C API (capi_probe_c.c,
capi_probe_cy.pyx) with setuptools into a folder, the way a user would:
``include_dirs`` (and Cython's ``include_path``) = ``posenc_fast.get_include()``."""

import importlib.util
import shutil
import sysconfig
from pathlib import Path

import posenc_fast as pf

HERE = Path(__file__).resolve().parent


def have_compiler() -> bool:
    return shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) is not None


def build(name: str, folder: Path):
    """Compile probe `name` (capi_probe_c or capi_probe_cy) into `folder`; return the module."""
    from setuptools import Distribution, Extension

    source = next(HERE.glob(f"{name}.*"))
    shutil.copy(source, folder / source.name)
    extension = Extension(name, [str(folder / source.name)], include_dirs=[pf.get_include()],
                          extra_compile_args=["-O2"])
    if source.suffix == ".pyx":
        from Cython.Build import cythonize
        extension = cythonize([extension], include_path=[pf.get_include()], quiet=True)[0]
    distribution = Distribution({"name": name, "ext_modules": [extension]})
    command = distribution.get_command_obj("build_ext")
    command.build_lib = str(folder)
    command.build_temp = str(folder / "temp")
    command.ensure_finalized()
    command.run()
    spec = importlib.util.spec_from_file_location(name, command.get_ext_fullpath(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
