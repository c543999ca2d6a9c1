"""``python -m posenc_fast bench``: time the standard workloads beside NumPy and PyTorch.

For each workload (``_bench.cases.CLI_WORKLOADS``) it checks every
implementation against the float64 reference, then times them interleaved
in one process and prints one table: median time, GB/s (bytes the call must
read and write), speed-up over the NumPy expression and the max |difference|
to the reference.  The limit row is the cheapest NumPy call moving the same
bytes (``np.copyto``, ``out.fill``): what "at the speed of memory" means here.

``--save FILE`` writes posenc_fast's ratio to the limit per workload (with the
machine line and ``build_info``); ``--compare FILE`` measures again and exits
with status 3 when a ratio exceeds the saved one times ``--fail-above``.
Ratios, never times: both calls were timed interleaved in the same run, so
a CI on a noisy machine can gate on them.
"""

import argparse
import json
import math
import numbers
import os
import sys
import time

import numpy as np

# The check before timing is every callable's first (warm-up) call.
QUICK = {"rounds": 5, "target_ns": 200_000, "warmup": 0, "budget_s": 1.0}
FULL = {"rounds": 15, "target_ns": 1_000_000, "warmup": 1, "budget_s": None}
CLI_KINDS = ("posenc_fast", "limit", "numpy", "torch")
RATIOS_FORMAT = "posenc_fast bench ratios 1"
EXIT_WRONG, EXIT_USAGE, EXIT_SLOWER = 1, 2, 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``bench``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "Workloads: RoPE prefill (1,32,4096,128) out-of-place and in place, a decode step\n"
        "(16,32,1,128) with one position per sequence, one token (1,32,1,128), cos/sin for\n"
        "131072 positions x 64 frequencies, sinusoidal tables 131072x128 and 8192x1024.\n"
        "Rows: posenc_fast, the limit (np.copyto / out.fill: the same bytes moved), the\n"
        "NumPy expression a user would write and, when torch is importable, PyTorch eager.\n"
        "Times are medians of interleaved rounds; every result is checked first.")
    parser.add_argument("--quick", action="store_true",
                        help=f"up to {QUICK['rounds']} rounds (3 once a workload has taken "
                             f"{QUICK['budget_s']:g} s) of ~{QUICK['target_ns'] // 1000} us "
                             f"samples, no extra warm-up call, instead of {FULL['rounds']} "
                             f"rounds of ~{FULL['target_ns'] // 1000} us; the same shapes")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="dtype of the data and tables (default float32)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="threads posenc_fast and torch may use (default: posenc_fast's "
                             "setting: POSENC_FAST_NUM_THREADS or all cores); NumPy uses one")
    parser.add_argument("--json", action="store_true",
                        help="print JSON only (progress still goes to stderr)")
    parser.add_argument("--save", metavar="FILE",
                        help="write posenc_fast's ratio to the limit per workload as JSON")
    parser.add_argument("--compare", metavar="FILE",
                        help="compare the ratios with those --save wrote; exit with status 3 "
                             "when one exceeds the saved ratio times --fail-above (or a saved "
                             "workload was not measured)")
    parser.add_argument("--any-cpu", action="store_true",
                        help="--compare: accept a file saved on another CPU model or kernel "
                             "variant (ratios differ by CPU: W1 0.84x on one, 1.59x on another)")
    parser.add_argument("--fail-above", type=float, default=1.10, metavar="X",
                        help="--compare: the factor a ratio may grow by (default 1.10)")


class _Progress:
    """One line on stderr, rewritten in place on a terminal."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()
        self.width = 0

    def __call__(self, text: str) -> None:
        if self.tty:
            pad = max(0, self.width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self.width = len(text)
            self.stream.flush()

    def step(self, text: str) -> None:
        """A new stage: always shown (one line per stage when not a terminal)."""
        if self.tty:
            self(text)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def done(self) -> None:
        if self.tty and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()


def _result_dict(case, rows, skipped) -> dict:
    numpy_row = rows.get("numpy")
    from ._bench.timing import paired_ratio

    results = []
    for kind, row in rows.items():
        median = row.timing.median_ns
        entry = {
            "impl": kind, "label": row.label, "median_ns": median,
            "samples": len(row.timing.samples), "calls_per_sample": row.timing.number,
            "spread": row.timing.spread,
            "gb_per_s": case.bytes_moved / median if median > 0 else None,
            "speedup_vs_numpy": paired_ratio(numpy_row.timing, row.timing) if numpy_row else None,
            "ratio_to_limit": (paired_ratio(row.timing, rows["limit"].timing)
                               if "limit" in rows else None),
        }
        entry.update(row.diff.as_dict() if row.diff is not None else
                     {"max_abs_diff": None, "max_rel_diff": None, "max_ulp": None,
                      "tolerance_used": None, "ok": None})
        results.append(entry)
    shape = case.shape
    return {"key": case.key, "title": case.title, "dtype": case.dtype.name,
            "shape": [list(s) for s in shape] if isinstance(shape[0], tuple) else list(shape),
            "bytes_moved": case.bytes_moved, "limit": case.limit_label,
            "results": results, "skipped": skipped}


def _print_table(report: dict) -> None:
    from ._bench.timing import format_time

    head = report["posenc_fast"]
    print(f"posenc_fast {head['version']} ({head['isa_in_use']}, thread pool "
          f"{'on' if head['thread_pool'] else 'off'}), {report['threads']} thread(s), "
          f"{report['dtype']}, numpy {report['numpy']}, "
          f"torch {report['torch'] or 'not installed'}")
    print(f"{report['machine']}; {report['rounds']} interleaved rounds, medians"
          f"{' (--quick)' if report['quick'] else ''}")
    columns = ("workload", "impl", "median", "GB/s", "vs NumPy", "max |diff|")
    lines = []
    for workload in report["workloads"]:
        title = f"{workload['title']} {tuple(workload['shape'])}".replace(" ((", " (").replace(
            "),)", ")")
        for n, result in enumerate(workload["results"]):
            impl = result["label"] if result["impl"] != "posenc_fast" else "posenc_fast"
            if result["impl"] == "limit":
                impl = f"limit: {result['label']}"
            diff = "-" if result["max_abs_diff"] is None else f"{result['max_abs_diff']:.1e}"
            if result["ok"] is False:
                diff += " WRONG"
            speedup = result["speedup_vs_numpy"]
            lines.append((title if n == 0 else "", impl, format_time(result["median_ns"]),
                          f"{result['gb_per_s']:.1f}", "-" if speedup is None else
                          f"{speedup:.1f}x", diff))
        for kind, reason in workload["skipped"].items():
            if kind != "torch" or report["torch"]:
                lines.append(("", kind, "skipped", "", "", reason[:40]))
    widths = [max(len(str(line[i])) for line in lines + [columns]) for i in range(len(columns))]
    right = (False, False, True, True, True, True)

    def fmt(cells):
        return "  ".join(str(c).rjust(w) if r else str(c).ljust(w)
                         for c, w, r in zip(cells, widths, right)).rstrip()
    print(fmt(columns))
    print("  ".join("-" * w for w in widths))
    for line in lines:
        if line[0] and line is not lines[0]:
            print()
        print(fmt(line))
    print("GB/s: bytes the call must read and write / median time.  vs NumPy: the NumPy "
          "expression's time / this row's.\nmax |diff|: to posenc_fast.reference "
          "(float64 plain loops) on a sample of rows.")


def ratio_rows(report: dict) -> list[dict]:
    """posenc_fast's ratio to the limit, one entry per workload of a bench report."""
    from ._bench import cases
    return [{"key": w["key"], "title": w["title"], "dtype": w["dtype"],
             "shape": cases.shape_label(w["shape"]),
             "limit": w["limit"], "ratio": r["ratio_to_limit"]}
            for w in report["workloads"] for r in w["results"]
            if r["impl"] == "posenc_fast" and r["ratio_to_limit"] is not None]


def ratios_file(report: dict) -> dict:
    """What ``--save`` writes."""
    return {"format": RATIOS_FORMAT, "machine": report["machine"],
            "build_info": report["posenc_fast"], "dtype": report["dtype"],
            "threads": report["threads"], "quick": report["quick"],
            "rows": ratio_rows(report)}


def load_ratios(path: str, dtype: str, threads: int, machine: dict | None = None) -> dict:
    """Read a ``--save`` file for ``--compare``; ValueError says what is wrong with it.

    `machine` (``build_info()``'s ``cpu`` and ``isa_in_use``; None: any) must
    be the one the file was saved on.
    """
    try:
        with open(path) as fh:
            saved = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--compare {path}: cannot read it as JSON ({exc})") from None
    if not isinstance(saved, dict) or saved.get("format") != RATIOS_FORMAT:
        raise ValueError(f"--compare {path}: not a file written by bench --save "
                         f"(format {RATIOS_FORMAT!r})")
    for option, want in (("dtype", dtype), ("threads", threads)):
        if saved.get(option) != want:
            raise ValueError(f"--compare {path} was saved with --{option} {saved.get(option)}, "
                             f"this run uses {want}: pass --{option} {saved.get(option)}")
    rows = saved.get("rows")
    fields = {"key": str, "title": str, "dtype": str, "shape": str, "ratio": numbers.Real}
    if not isinstance(saved.get("build_info", {}), dict) or not isinstance(rows, list) or not all(
            isinstance(row, dict) and all(isinstance(row.get(f), t) and not isinstance(row.get(f), bool)
                                          for f, t in fields.items()) and math.isfinite(row["ratio"])
            for row in rows):
        raise ValueError(f"--compare {path}: its build_info must be an object and its rows a list of "
                         f"objects with {', '.join(fields)} (a finite ratio), as bench --save writes them")
    for key, want in (machine or {}).items():
        got = saved.get("build_info", {}).get(key)
        if got != want:
            raise ValueError(f"--compare {path} was saved with {key} {got!r}, this machine has "
                             f"{want!r}: ratios to the limit differ by CPU and kernel variant; "
                             f"compare files of the same machine, or pass --any-cpu")
    return saved


def compare_ratios(saved_rows: list[dict], measured_rows: list[dict],
                   fail_above: float) -> list[dict]:
    """One entry per workload: saved and measured ratio, and a status.

    Status "ok", "SLOWER" (measured > saved * fail_above), "MISSING" (saved,
    not measured) or "new" (measured, not saved); SLOWER and MISSING fail.
    """
    def ident(row):
        return row["key"], row["dtype"], row["shape"]

    measured = {ident(row): row for row in measured_rows}
    entries = []
    for row in saved_rows:
        now = measured.pop(ident(row), None)
        entry = {**row, "saved": row["ratio"], "ratio": None if now is None else now["ratio"],
                 "allowed": row["ratio"] * fail_above}
        entry["status"] = ("MISSING" if now is None else
                           "SLOWER" if now["ratio"] > entry["allowed"] else "ok")
        entries.append(entry)
    entries += [{**row, "saved": None, "allowed": None, "status": "new"}
                for row in measured.values()]
    return entries


def _print_comparison(entries: list[dict], path: str, saved: dict, fail_above: float) -> None:
    print(f"\nRatios to the limit against {path} (saved on {saved.get('machine')}, "
          f"posenc_fast {saved.get('build_info', {}).get('version')}); fail above "
          f"{fail_above:g}x the saved ratio")
    head = ("workload", "shape", "saved", "now", "now / saved", "status")
    lines = [head]
    for e in entries:
        known = e["saved"] is not None and e["ratio"] is not None
        lines.append((f"{e['title']} {e['dtype']}", e["shape"],
                      "-" if e["saved"] is None else f"{e['saved']:.3g}",
                      "-" if e["ratio"] is None else f"{e['ratio']:.3g}",
                      f"{e['ratio'] / e['saved']:.2f}" if known else "-", e["status"]))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; return 0, 1 if a result differs from the reference, 2 on bad
    arguments, 3 if ``--compare`` found a ratio above the saved one times ``--fail-above``."""
    from . import _threads, build_info
    from ._bench import cases, timing, torch_rows

    if args.threads is not None and args.threads < 1:
        print("bench: --threads must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    if not args.fail_above > 0:
        print(f"bench: --fail-above must be > 0, got {args.fail_above}", file=sys.stderr)
        return EXIT_USAGE
    # posenc_fast and torch get the same count: --threads, else posenc_fast's setting.
    threads = args.threads if args.threads is not None else _threads.get_num_threads()
    folder = os.path.dirname(os.path.abspath(args.save)) if args.save is not None else None
    if folder is not None and (os.path.isdir(args.save) or not os.access(folder, os.W_OK)):
        print(f"bench: --save {args.save}: not a file this user can write in an existing folder",
              file=sys.stderr)
        return EXIT_USAGE
    saved = None
    if args.compare is not None:
        try:
            here = build_info()
            saved = load_ratios(args.compare, args.dtype, threads, None if args.any_cpu else
                                {key: here[key] for key in ("cpu", "isa_in_use")})
        except ValueError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return EXIT_USAGE
    settings = QUICK if args.quick else FULL
    progress = _Progress()
    start = time.perf_counter()
    kinds = CLI_KINDS
    torch_version = None
    try:
        torch_version = torch_rows.torch_or_unavailable().__version__
    except torch_rows.Unavailable:
        kinds = tuple(k for k in CLI_KINDS if k != "torch")
    workloads = []
    with timing.restored_threads():
        timing.set_threads(threads)
        info = build_info()
        keys = cases.CLI_WORKLOADS
        for number, key in enumerate(keys, 1):
            title = cases.WORKLOADS[key].title
            progress.step(f"[{number}/{len(keys)}] {title}: building")
            case = cases.build_case(key, args.dtype)

            def tell(text, number=number, title=title):
                progress(f"[{number}/{len(keys)}] {title}: {text}")
            rows, skipped = timing.time_case(case, kinds, rounds=settings["rounds"],
                                             target_ns=settings["target_ns"],
                                             warmup=settings["warmup"], progress=tell,
                                             budget_s=settings["budget_s"])
            workloads.append(_result_dict(case, rows, skipped))
            del case, rows
    progress.done()
    report = {
        "posenc_fast": info, "numpy": np.__version__, "torch": torch_version,
        "machine": timing.machine_line(), "dtype": args.dtype, "threads": info["num_threads"],
        "quick": bool(args.quick), "rounds": settings["rounds"],
        "seconds": round(time.perf_counter() - start, 2), "workloads": workloads,
    }
    if args.save is not None:
        try:
            with open(args.save, "w") as fh:
                json.dump(ratios_file(report), fh, indent=1)
        except OSError as exc:
            print(f"bench: --save {args.save}: cannot write it ({exc})", file=sys.stderr)
            return EXIT_USAGE
    entries = None
    if saved is not None:
        entries = compare_ratios(saved["rows"], ratio_rows(report), args.fail_above)
        report["comparison"] = {"file": args.compare, "fail_above": args.fail_above,
                                "rows": entries}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print_table(report)
        if entries is not None:
            _print_comparison(entries, args.compare, saved, args.fail_above)
    wrong = [f"{w['title']}: {r['label']}" for w in workloads for r in w["results"]
             if r["ok"] is False]
    if wrong:
        print("bench: results differ from the reference beyond tolerance: " + "; ".join(wrong),
              file=sys.stderr)
        return EXIT_WRONG
    failed = [f"{e['title']} {e['dtype']} ({e['status']})" for e in entries or ()
              if e["status"] in ("SLOWER", "MISSING")]
    if failed:
        print(f"bench: ratio to the limit above {args.fail_above:g}x the saved one in "
              f"{args.compare}: " + "; ".join(failed), file=sys.stderr)
        return EXIT_SLOWER
    return 0
