"""Print the goal table of issues 6, 19 and 29: each goal's time / limit time, measured here, met or not.

    python3 bench/report.py [--rounds N] [--quick] [--small] [--hog] [--contention]
                            [--placements K] [--json]

The workloads are those of ``posenc_fast._bench.cases`` (also timed by the
pytest-benchmark suite and ``python -m posenc_fast bench``); `GOALS` lists
the rows, by regime: memory-bound (the workloads' own shapes, 64 MiB and
more), in cache (W1 and apply_qk at 4 MiB ``(1,32,256,128)`` and 512 KiB
``(1,32,32,128)`` float32), decode, tables, scores, half types (bfloat16
and float16 W1) and head sizes (W1 float32 at head_dim 64 to 256, 64 MiB
each, the half layout and the interleaved one; and 4 MiB each, the half
layout, with the in-cache rows' goals).  For every goal
posenc_fast and its limit (the cheapest NumPy call that moves the same
bytes) are timed in the same process, interleaved (each round in an order
of its own), after a warm-up and a check against the float64 reference; the
measured value is the median over rounds of (our time / limit time).
``--placements K`` splits each goal's rounds over K builds of its arrays,
each on pages of its own (the median then spans where the arrays lie).
Everything runs on one thread except the threads goal, which compares 1
thread with N (all cores) and N-thread posenc_fast with an N-thread
``np.copyto``.

A goal is met when the ratio is within it *and* the result is exact: within
the reference tolerance, and for the float32 tables (W4, W5) at most 1 ulp
(see ``posenc_fast._tolerance.float32_ulps`` for how ulps are counted near zeros).

``--hog`` runs a memory-bandwidth hog (``_bench.neighbours``: a process
looping ``np.add(a, 1, out=a)`` over 256 MiB) during the whole measurement,
kernels and limits alike.  ``--contention`` measures issue 19's "threads
never hurt" table instead (``_bench.contention``): per-call p50/p99 with the
default thread count against one thread, beside a CPU-bound process.
"""

import argparse
import datetime
import json
import os
import platform
import re
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

try:
    import posenc_fast as pf
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import posenc_fast as pf

import numpy as np

from posenc_fast._bench import cases, contention, timing
from posenc_fast._bench.neighbours import Neighbour


@dataclass(frozen=True)
class Goal:
    """One row: a workload at a dtype and shape, and its goal (time / limit)."""

    regime: str
    key: str
    dtype: str
    shape: tuple | None = None      # None: the workload's own (--small: its small shape)
    goal: float | None = None       # None: the workload's own


MIB_4, KIB_512 = (1, 32, 256, 128), (1, 32, 32, 128)      # W1 float32 in cache
GOALS = [
    Goal("memory", "w1_oop", "float32"),
    Goal("memory", "w1_oop", "float64"),
    Goal("memory", "w1_inplace", "float32"),
    Goal("memory", "w1_inplace", "float64"),
    Goal("memory", "apply_qk", "float32"),
    Goal("cache", "w1_oop", "float32", MIB_4, 1.3),
    Goal("cache", "w1_oop", "float32", KIB_512, 1.3),
    Goal("cache", "w1_inplace", "float32", MIB_4, 1.5),
    Goal("cache", "w1_inplace", "float32", KIB_512, 1.5),
    Goal("cache", "apply_qk", "float32", (MIB_4, (1, 8, 256, 128)), 1.3),
    Goal("cache", "apply_qk", "float32", (KIB_512, (1, 8, 32, 128)), 1.3),
    Goal("decode", "w2_decode", "float32"),
    Goal("decode", "w3_token", "float32"),
    Goal("tables", "w4_cos_sin", "float32"),
    Goal("tables", "w5_sinusoidal_131072x128", "float32"),
    Goal("tables", "w5_sinusoidal_8192x1024", "float32"),
    Goal("scores", "alibi", "float32"),
    Goal("scores", "alibi_exact", "float32"),  # issue 29: in cache, bound by its conversions
    Goal("scores", "position_table", "float32"),
    # issue 29: the half types, and head sizes of the model zoo (64 MiB of float32 each)
    Goal("half types", "w1_oop", "bfloat16"),
    Goal("half types", "w1_inplace", "bfloat16"),
    Goal("half types", "w1_oop", "float16"),
    Goal("half types", "w1_inplace", "float16"),
    *(Goal("head sizes", key, "float32", (1, 32, (1 << 19) // dim, dim))
      for dim in (64, 80, 96, 100, 112, 160, 192, 256) for key in ("w1_oop", "w1_inplace")),
    *(Goal("head sizes", key, "float32", (1, 32, (1 << 19) // dim, dim))
      for dim in (64, 80, 96, 100, 112, 128, 160, 192, 256)
      for key in ("w1_oop_interleaved", "w1_inplace_interleaved")),
    # in cache (4 MiB) as MIB_4's rows: blocks of rows, whose pair count is a constant (posenc_block_)
    *(Goal("cache head sizes", key, "float32", (1, 32, (1 << 15) // dim, dim), goal)
      for dim in (64, 80, 96, 100, 112, 160, 192, 256) for key, goal in (("w1_oop", 1.3), ("w1_inplace", 1.5))),
]
THREADS_GOAL = ("W1 out-of-place with {n} threads", 1.6, 1.15)
MAX_ULPS = 1.0                      # the tables' exactness goal (float32 ulps)
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _shape_text(shape):
    if isinstance(shape[0], tuple):
        return " + ".join(_shape_text(s) for s in shape)
    return "(" + ",".join(map(str, shape)) + ")"


def _exactness(diff):
    """(text, ok) for a Diff; tables (which have ulps) within MAX_ULPS."""
    if diff is None:
        return "-", True
    if diff.max_ulp is not None:
        text = f"{diff.max_ulp:.2f} ulp"
        ok = diff.ok and diff.max_ulp <= MAX_ULPS
    else:
        text = f"rel {diff.max_rel:.1e}"
        ok = diff.ok
    return text, ok


def measure_goal(goal, *, small, rounds, target_ns, progress, placements=1):
    """A goal's row: its rounds split over `placements` builds of the case, each on arrays of its
    own (the ones before kept alive, so that each lands on other pages: on the AMD Zen 4 of
    bench/README.md an in-cache row read 1.55x or 1.90x from one array to the next)."""
    built, timed = [], []
    for count in (rounds // placements + (i < rounds % placements) for i in range(placements)):
        if count == 0:
            continue
        built.append(cases.build_case(goal.key, goal.dtype, small, goal.shape))
        with timing.restored_threads():
            timing.set_threads(1)
            rows, _ = timing.time_case(built[-1], ("posenc_fast", "limit"), rounds=count,
                                       target_ns=target_ns, progress=progress)
        timed.append(rows)
    case = built[0]
    goal_ratio = goal.goal or case.goal
    row = {"regime": goal.regime, "workload": case.title, "key": goal.key, "dtype": goal.dtype,
           "shape": _shape_text(case.shape), "goal": f"<= {goal_ratio:g}x",
           "goal_ratio": goal_ratio, "limit": case.limit_label}
    ours, limit = (timing.joined([rows[kind].timing for rows in timed])
                   for kind in ("posenc_fast", "limit"))
    ratio = timing.paired_ratio(ours, limit)
    quartiles = timing.paired_ratio_quartiles(ours, limit)
    diff = timed[0]["posenc_fast"].diff  # every build computes the same values
    exact_text, exact_ok = _exactness(diff)
    row.update(measured=ratio, quartiles=quartiles, ours_median_ns=ours.median_ns,
               limit_median_ns=limit.median_ns, ours_spread=ours.spread,
               limit_spread=limit.spread, rounds=len(ours.samples), placements=len(built),
               exact=exact_text, exact_ok=exact_ok, diff=diff.as_dict() if diff else None,
               met=bool(ratio <= goal_ratio and exact_ok))
    return row


def measure_threads(n, *, small, rounds, target_ns, progress):
    """W1 out-of-place float32: 1 vs n threads, and n threads vs an n-thread copy."""
    label, speedup_goal, copy_goal = THREADS_GOAL
    label = label.format(n=n)
    row = {"regime": "threads", "workload": label, "key": "w1_oop", "dtype": "float32",
           "shape": _shape_text(cases.WORKLOADS["w1_oop"].small_shape if small
                                else cases.WORKLOADS["w1_oop"].shape),
           "goal": f">= {speedup_goal}x vs 1 thread, or <= {copy_goal}x of a {n}-thread copy",
           "limit": f"np.copyto split over {n} threads"}
    if n < 2:
        row.update(measured=None, met=None, note="one core: no threads goal")
        return row
    case = cases.build_case("w1_oop", "float32", small)
    ours = case.impl("posenc_fast")
    copy_n = timing.ParallelCopy(case.parts.outputs[0], case.parts.sources[0], n)
    try:
        with timing.restored_threads():
            timing.set_threads(n)
            diff = ours.verify()
            timings = timing.measure(
                {"ours_1": ours.run, "ours_n": ours.run, "copy_1": case.impl("limit").run,
                 "copy_n": copy_n},
                rounds=rounds, target_ns=target_ns,
                before={"ours_1": lambda: timing.set_threads(1),
                        "ours_n": lambda: timing.set_threads(n)},
                progress=progress)
    finally:
        copy_n.close()
    speedup = timing.paired_ratio(timings["ours_1"], timings["ours_n"])
    quartiles = timing.paired_ratio_quartiles(timings["ours_1"], timings["ours_n"])
    to_copy = timing.paired_ratio(timings["ours_n"], timings["copy_n"])
    copy_speedup = timing.paired_ratio(timings["copy_1"], timings["copy_n"])
    exact_text, exact_ok = _exactness(diff)
    row.update(measured=speedup, quartiles=quartiles, speedup=speedup, ratio_to_copy_n=to_copy,
               copy_speedup=copy_speedup, exact=exact_text, exact_ok=exact_ok,
               ours_median_ns=timings["ours_n"].median_ns,
               limit_median_ns=timings["copy_n"].median_ns,
               rounds=len(timings["ours_1"].samples),
               met=bool((speedup >= speedup_goal or to_copy <= copy_goal) and exact_ok))
    return row


def _measured_text(row):
    if row.get("measured") is None:
        return row.get("note", "n/a")
    low, high = row["quartiles"]
    if "speedup" in row:
        return (f"{row['speedup']:.2f}x faster ({low:.2f}-{high:.2f}); "
                f"{row['ratio_to_copy_n']:.2f}x of the copy")
    return f"{row['measured']:.2f}x ({low:.2f}-{high:.2f})"


def _markdown(head, lines):
    widths = [max(len(line[i]) for line in lines + [head]) for i in range(len(head))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in lines:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |")


def _met_text(row):
    return {True: "yes", False: "NO", None: "-"}[row.get("met")]


def _header(report, title, settings):
    info = report["build_info"]
    print(f"posenc_fast {info['version']} {title} -- {report['machine']}; {report['date']}")
    print(f"ISA {info['isa_in_use']}, threads by default {report['default_threads']}, "
          f"numpy {report['numpy']}, python {report['python']}; {settings}")
    print("memory-bandwidth hog: " + (report["hog"] or "none"))


def print_goal_table(report):
    placements = report.get("placements", 1)
    _header(report, "goal table (issues 6, 19, 29)",
            f"{report['rounds']} interleaved rounds"
            f"{f' over {placements} placements of the arrays' if placements > 1 else ''}"
            f"; measured = median over rounds of time/limit (quartiles); 1 thread unless stated"
            f"{'; SMALL shapes' if report['small'] else ''}")
    head = ("regime", "workload", "shape", "dtype", "limit", "goal (time/limit)", "measured",
            "exact", "ours / limit", "met?")
    lines = []
    for row in report["rows"]:
        times = ""
        if row.get("ours_median_ns") is not None:
            times = (f"{timing.format_time(row['ours_median_ns'])} / "
                     f"{timing.format_time(row['limit_median_ns'])}")
        lines.append((row["regime"], row["workload"], row["shape"], row["dtype"], row["limit"],
                      row["goal"], _measured_text(row), row.get("exact", "-"), times,
                      _met_text(row)))
    _markdown(head, lines)
    met = [r for r in report["rows"] if r.get("met") is not None]
    print(f"{sum(r['met'] for r in met)} of {len(met)} goals met.  'ours / limit' are the two "
          f"medians (context only: the claim is the ratio, measured interleaved).")


def print_contention_table(report):
    _header(report, "contention table (issue 19: threads never hurt)",
            f"float32; up to {report['calls']} single calls per thread setting and neighbour, "
            f"in interleaved blocks; goal p50 <= {contention.P50_GOAL:g}x and p99 <= "
            f"{contention.P99_GOAL:g}x one thread's")
    head = ("call", "shape", "neighbour", "calls", "p50 default / 1 thread", "p50 ratio",
            "p99 default / 1 thread", "p99 ratio", "met?")
    lines = []
    for row in report["rows"]:
        if row.get("met") is None:
            lines.append((row["call"], row["shape"], row["neighbour"], "", row["note"], "", "",
                          "", "-"))
            continue
        cells = []
        for q in (50, 99):
            cells += [f"{timing.format_time(row[f'p{q}_default_ns'])} / "
                      f"{timing.format_time(row[f'p{q}_one_ns'])}", f"{row[f'p{q}_ratio']:.2f}x"]
        lines.append((row["call"], row["shape"], row["neighbour"], str(row["calls"]), *cells,
                      _met_text(row) + ("" if row["exact_ok"] else " (WRONG result)")))
    _markdown(head, lines)
    early = [row["neighbour_ran"] for row in report["rows"]
             if "EXITED EARLY" in (row.get("neighbour_ran") or "")]
    print("neighbour: " + contention.KINDS_TEXT + "; " +
          ("; ".join(early) if early else "each ran through its row (passes in the JSON)"))
    goals = [r for r in report["rows"] if r["neighbour"] != "none" and r.get("met") is not None]
    print(f"{sum(r['met'] for r in goals)} of {len(goals)} goals met beside a busy neighbour "
          f"(the rows without one are context).")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=31, help="interleaved rounds (default 31)")
    parser.add_argument("--quick", action="store_true",
                        help="5 rounds of shorter samples (--contention: 1 s per row)")
    parser.add_argument("--small", action="store_true",
                        help="reduced shapes (smoke test; not the issue's workloads)")
    parser.add_argument("--hog", action="store_true",
                        help="run a memory-bandwidth hog process during the whole measurement")
    parser.add_argument("--contention", action="store_true",
                        help="measure the contention table (p50/p99, default threads vs 1) "
                             "instead of the goal table")
    parser.add_argument("--calls", type=int, default=3000,
                        help="--contention: at most this many calls per thread setting and "
                             "row (default 3000; each row stops after 6 s, 1 s with --quick)")
    parser.add_argument("--only", metavar="REGEX",
                        help="measure only the goals whose 'regime key shape' matches REGEX "
                             "(e.g. 'cache.*w1', 'alibi'; the threads row is 'threads')")
    parser.add_argument("--placements", type=int, default=1,
                        help="split each goal's rounds over this many builds of its arrays, each "
                             "on pages of its own (default 1; an in-cache row can read 1.5x or "
                             "1.9x by where its array lies)")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1 or args.placements < 1:
        parser.error("--rounds, --calls and --placements must be >= 1")
    rounds = 5 if args.quick else args.rounds
    target_ns = 200_000 if args.quick else 1_000_000
    small = args.small or cases.small_from_environment()
    default_threads = pf.get_num_threads()
    tty = sys.stderr.isatty()

    def chosen(name):
        return args.only is None or re.search(args.only, name) is not None

    def progress(text):
        if tty:
            sys.stderr.write("\r" + text[:100].ljust(100))
            sys.stderr.flush()

    def step(label):
        if not tty:
            print(f"measuring {label}", file=sys.stderr)
        return lambda t: progress(f"{label}: {t}")

    with Neighbour("hog") if args.hog else nullcontext() as hog:
        if args.contention:
            rows = contention.measure(default_threads, calls=args.calls,
                                      budget_s=1.0 if args.quick else 6.0,
                                      progress=step("contention"))
        else:
            rows = [measure_goal(goal, small=small, rounds=rounds, target_ns=target_ns,
                                 progress=step(f"{goal.key} {goal.dtype} {goal.shape or ''}"),
                                 placements=args.placements)
                    for goal in GOALS if chosen(f"{goal.regime} {goal.key} {goal.shape or ''}")]
            if chosen("threads"):
                rows.append(measure_threads(CORES, small=small, rounds=rounds,
                                            target_ns=target_ns, progress=step("threads")))
    if tty:
        sys.stderr.write("\r" + " " * 100 + "\r")
    report = {
        "table": "contention" if args.contention else "goals",
        "build_info": pf.build_info(), "numpy": np.__version__,
        "python": platform.python_version(), "machine": timing.machine_line(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="minutes"),
        "default_threads": default_threads, "hog": hog.summary() if hog else None,
        "rounds": rounds, "placements": args.placements, "calls": args.calls, "small": small,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(report, indent=1))
    elif args.contention:
        print_contention_table(report)
    else:
        print_goal_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
