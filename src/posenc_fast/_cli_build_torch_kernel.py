"""``python -m posenc_fast build-torch-kernel``: compile the torch op's C++ kernel for the torch here."""

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``build-torch-kernel`` takes no options."""


def run(args: argparse.Namespace) -> int:
    """Build the kernel (`posenc_fast._torch_kernel.build`); 1 without torch or when the compiler fails."""
    try:
        import torch
    except ImportError:
        print("build-torch-kernel needs torch: pip install torch", file=sys.stderr)
        return 1
    from . import _torch_kernel

    try:
        path = _torch_kernel.build(torch)
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"built {path}; posenc_fast.torch_ops loads it at import")
    return 0
