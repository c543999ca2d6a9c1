"""Sweep one tuning constant: build the package per value, time report.py's rows per build.

    python3 bench/sweep.py NAME VALUE [VALUE ...] --only REGEX [--passes 5] [--rounds 7]
                           [--modes quiet,hog] [--variants baseline,avx512bf16] [--isa avx2]
                           [--json FILE]

NAME is a macro of ``csrc/posenc_config.h`` or ``posenc_trig.h`` guarded by
``#ifndef NAME`` (e.g. POSENC_PREFETCH_DISTANCE).  Each value is built once,
with ``-DNAME=VALUE`` added to CFLAGS (`build_cflags`: setuptools takes CFLAGS from the
environment in place of the flags Python was built with, so they are passed too), into
its own copy of the tree in a temporary directory (removed at the end; folder names of one length,
`build_dirs`, so that every value's process has its stack at one place), so
the checkout is not touched.  Then each pass runs ``report.py --json --only
REGEX`` once per value and mode (quiet, and with ``--hog``), each in its own
process on that value's build, the values in a rotated order, so that
machine noise hits all values alike (``--isa`` sets POSENC_FAST_ISA there).
The table gives, per row, the median over passes of report.py's measured
ratio (time / limit, itself a median of interleaved rounds) and the range.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from statistics import median

import report

TREE = Path(__file__).resolve().parents[1]
HEADERS = TREE / "src" / "posenc_fast" / "csrc"
COPY_IGNORE = shutil.ignore_patterns(".git", "build", "*.so", "__pycache__", ".benchmarks",
                                     "*.egg-info", ".pytest_cache")


def run(command, **kwargs):
    """subprocess.run, capturing the output; raise RuntimeError with its end on failure."""
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n"
                           f"{(done.stdout + done.stderr)[-3000:]}")
    return done


def check_overridable(name):
    """Raise ValueError unless some header defines `name` under ``#ifndef name``."""
    if not any(f"#ifndef {name}\n" in h.read_text() for h in HEADERS.glob("*.h")):
        raise ValueError(f"NAME: {name} is not guarded by '#ifndef {name}' in any header of "
                         f"{HEADERS}; -D{name}=... would not take effect")


def build_cflags(name, value, environ=os.environ):
    """CFLAGS for a build with -Dname=value that is otherwise the build pip makes.

    setuptools compiles with ``environ["CFLAGS"]`` where it is set, in place of the flags
    Python was built with (``-fwrapv``, ``-DNDEBUG``, ...), so those are kept here: without
    them the sweeps measured other code than the package's (W1 float64 in place 1.30x
    against 1.43x its limit on an AMD EPYC Zen 3, bench/sweeps.md).
    """
    base = environ.get("CFLAGS", sysconfig.get_config_var("CFLAGS") or "")
    return f"{base} -D{name}={value}".strip()


def build_dirs(workdir, values):
    """{value: the folder its build goes to}: names of one length, so that every value's process has an
    environment (PYTHONPATH) of one size and its stack where the others' is: on an AMD Zen 3 the stack's
    position alone moved rows by up to 0.4x (bench/sweeps.md, 2026-12-05)."""
    return {value: workdir / f"build{i:03d}" for i, value in enumerate(values)}


def build(name, value, dest, variants):
    """Copy the tree to dest and build it there with -DNAME=VALUE; its src dir."""
    shutil.copytree(TREE, dest, ignore=COPY_IGNORE)
    env = dict(os.environ, CFLAGS=build_cflags(name, value), POSENC_FAST_ISA_VARIANTS=variants)
    print(f"building {name}={value} in {dest.name} ...", file=sys.stderr, flush=True)
    done = run(["nice", "-n", "10", sys.executable, "setup.py", "build_ext", "--inplace", "-j",
                "2"], cwd=dest, env=env)
    if f"-D{name}={value}" not in done.stdout + done.stderr:
        raise RuntimeError(f"the build of {dest} did not show -D{name}={value} in its compile "
                           f"commands: CFLAGS did not reach the compiler")
    return dest / "src"


def measure(src, regex, rounds, hog, isa):
    """report.py's JSON rows for the goals matching regex, run on the build in src."""
    command = [sys.executable, str(TREE / "bench" / "report.py"), "--json", "--only", regex,
               "--rounds", str(rounds)] + (["--hog"] if hog else [])
    env = dict(os.environ, PYTHONPATH=str(src))
    if isa:
        env["POSENC_FAST_ISA"] = isa
    result = json.loads(run(command, env=env).stdout)
    if isa and result["build_info"]["isa_in_use"] != isa:
        raise RuntimeError(f"--isa {isa}: the build ran {result['build_info']['isa_in_use']} "
                           f"(is {isa} in --variants?)")
    if hog and "EXITED EARLY" in (result["hog"] or ""):
        raise RuntimeError(f"the hog did not run through the measurement: {result['hog']}")
    return result


def row_label(row):
    return f"{row['workload']} {row['shape']} {row['dtype']}"


def sweep(name, values, regex, *, passes, rounds, modes, workdir, variants, isa):
    """{mode: {row label: {value: [measured ratio per pass]}}}, and the ISA the builds ran."""
    sources = {v: build(name, v, dest, variants) for v, dest in build_dirs(workdir, values).items()}
    ratios = {mode: {} for mode in modes}
    isa_in_use = set()
    for p in range(passes):
        for mode in modes:
            order = values[p % len(values):] + values[:p % len(values)]
            for value in order:
                print(f"pass {p + 1}/{passes} {mode} {name}={value}", file=sys.stderr, flush=True)
                result = measure(sources[value], regex, rounds, mode == "hog", isa)
                isa_in_use.add(result["build_info"]["isa_in_use"])
                for row in result["rows"]:
                    ratios[mode].setdefault(row_label(row), {}).setdefault(value, []).append(
                        row["measured"])
    return ratios, sorted(isa_in_use)


def print_table(name, values, ratios):
    head = ("row", "mode", *(f"{name}={v}" for v in values))
    lines = []
    for mode, rows in ratios.items():
        for label, by_value in rows.items():
            lines.append((label, mode, *(f"{median(by_value[v]):.3f} ({min(by_value[v]):.2f}-"
                                         f"{max(by_value[v]):.2f})" for v in values)))
    report._markdown(head, lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the macro, e.g. POSENC_PREFETCH_DISTANCE")
    parser.add_argument("values", nargs="+", help="C expressions, e.g. 4096 '(1<<20)'")
    parser.add_argument("--only", required=True, metavar="REGEX",
                        help="report.py's rows to time ('regime key shape', as report.py --only)")
    parser.add_argument("--passes", type=int, default=5,
                        help="processes per value and mode (default 5)")
    parser.add_argument("--rounds", type=int, default=7,
                        help="interleaved rounds per process (report.py --rounds; default 7)")
    parser.add_argument("--modes", default="quiet,hog",
                        help="comma list of quiet, hog (default both)")
    parser.add_argument("--variants", default="baseline,avx2,avx512,avx512bf16",
                        help="POSENC_FAST_ISA_VARIANTS of the builds (default all)")
    parser.add_argument("--isa", help="POSENC_FAST_ISA for the measurements (default: "
                        "the package's choice)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also save the ratios as JSON")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"quiet", "hog"}:
        parser.error(f"--modes: expected a comma list of quiet, hog; got {args.modes!r}")
    if args.passes < 1 or args.rounds < 1:
        parser.error("--passes and --rounds must be >= 1")
    if len(set(args.values)) != len(args.values) or any(v.split() != [v] for v in args.values):
        parser.error("values: each value once, without spaces (they go into CFLAGS)")
    try:
        check_overridable(args.name)
    except ValueError as error:
        parser.error(str(error))
    with tempfile.TemporaryDirectory(prefix="posenc_sweep_") as workdir:
        ratios, isa_in_use = sweep(args.name, args.values, args.only, passes=args.passes,
                            rounds=args.rounds, modes=modes, workdir=Path(workdir),
                            variants=args.variants, isa=args.isa)
    print(f"{args.name} sweep -- {report.timing.machine_line()}; ISA {', '.join(isa_in_use)}; "
          f"median over {args.passes} processes of report.py's ratio ({args.rounds} "
          f"interleaved rounds each); range over processes")
    print_table(args.name, args.values, ratios)
    if args.json:
        args.json.write_text(json.dumps({"name": args.name, "values": args.values,
                                         "isa": isa_in_use, "ratios": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
