"""Command line: ``python -m posenc_fast info | bench | plot | check | tune | build-torch-kernel``.

Each command lives in its own module (``_cli_<command>.py``, ``-`` as ``_``) that provides
``add_arguments(parser)`` and ``run(args) -> int``; this file only wires them.
"""

import argparse
import importlib
import sys

COMMANDS = {
    "info": "print the build facts (version, compiler, instruction sets, thread pool, threads)",
    "bench": "time the standard workloads beside NumPy (and PyTorch when installed)",
    "plot": "write PNG figures of the encodings (needs matplotlib: pip install posenc-fast[plot])",
    "check": "test this installation against the pure-Python reference on random cases",
    "tune": "time the kernel variants and block sizes on this CPU, store the fastest for the next import",
    "build-torch-kernel": "compile torch.ops.posenc_fast.rotary_embedding's C++ kernel for the torch installed here",
}


def main(argv=None) -> int:
    """Run the command line; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m posenc_fast",
                                     description="posenc_fast: fast, exact positional encodings")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"posenc_fast._cli_{name.replace('-', '_')}")
        sub = commands.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
