"""``python -m posenc_fast info``: print build_info() as aligned lines."""

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``info``."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    """Print the build facts."""
    from . import build_info

    info = build_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key, value in info.items():
        if isinstance(value, list):
            value = ", ".join(value)
        print(f"{key:14} {value}")
    return 0
