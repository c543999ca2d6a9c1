"""Print issue 6's goal table: each workload's time / limit time, measured here, and met or not.

    python3 bench/report.py [--rounds N] [--quick] [--small] [--json]

The workloads are those of ``posenc_fast._bench.cases`` (also timed by the
pytest-benchmark suite and ``python -m posenc_fast bench``).  For every goal
posenc_fast and its limit (the cheapest NumPy call that moves the same bytes)
are timed in the same process, interleaved (ours, limit, ours, limit, ...),
after a warm-up and a check against the float64 reference; the measured
value is the median over rounds of (our time / limit time).  Everything runs
on one thread except the threads goal, which compares 1 thread with N (all
cores) and N-thread posenc_fast with an N-thread ``np.copyto``.

A goal is met when the ratio is within it *and* the result is exact: within
the reference tolerance, and for the float32 tables (W4, W5) at most 1 ulp
(see ``posenc_fast._tolerance.float32_ulps`` for how ulps are counted near zeros).
"""

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

try:
    import posenc_fast as pf
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import posenc_fast as pf

import numpy as np

from posenc_fast._bench import cases, timing

# (label, workload, dtype, ulp bound or None); the goal (time / limit) comes from the workload.
GOALS = [
    ("W1 RoPE prefill, out-of-place", "w1_oop", "float32", None),
    ("W1 RoPE prefill, out-of-place", "w1_oop", "float64", None),
    ("W1 RoPE prefill, in place", "w1_inplace", "float32", None),
    ("W1 RoPE prefill, in place", "w1_inplace", "float64", None),
    ("W2 decode step, a position per sequence", "w2_decode", "float32", None),
    ("W3 one token, offset=4096", "w3_token", "float32", None),
    ("W4 RotaryEmbedding.cos_sin, <= 1 ulp", "w4_cos_sin", "float32", 1.0),
    ("W5 sinusoidal_table, <= 1 ulp", "w5_sinusoidal_131072x128", "float32", 1.0),
    ("W5 sinusoidal_table, <= 1 ulp", "w5_sinusoidal_8192x1024", "float32", 1.0),
    ("apply_qk, q and k (GQA)", "apply_qk", "float32", None),
    ("add_alibi in place", "alibi", "float32", None),
]
THREADS_GOAL = ("W1 out-of-place with {n} threads", 1.6, 1.15)
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _shape_text(shape):
    if isinstance(shape[0], tuple):
        return " + ".join(_shape_text(s) for s in shape)
    return "(" + ",".join(map(str, shape)) + ")"


def _exactness(diff, ulp_bound):
    """(text, ok) for a Diff."""
    if diff is None:
        return "-", True
    if diff.max_ulp is not None:
        text = f"{diff.max_ulp:.2f} ulp"
        ok = diff.ok and (ulp_bound is None or diff.max_ulp <= ulp_bound)
    else:
        text = f"rel {diff.max_rel:.1e}"
        ok = diff.ok
    return text, ok


def measure_goal(label, key, dtype, ulp_bound, *, small, rounds, target_ns, progress):
    case = cases.build_case(key, dtype, small)
    row = {"workload": label, "key": key, "dtype": dtype, "shape": _shape_text(case.shape),
           "goal": case.goal_text, "goal_ratio": case.goal, "limit": case.limit_label}
    try:
        case.impl("posenc_fast")
    except cases.Unavailable as exc:
        row.update(measured=None, met=None, note="not available: " + str(exc).split(" (")[0])
        return row
    with timing.restored_threads():
        timing.set_threads(1)
        rows, _ = timing.time_case(case, ("posenc_fast", "limit"), rounds=rounds,
                                   target_ns=target_ns, progress=progress)
    ours, limit = rows["posenc_fast"], rows["limit"]
    ratio = timing.paired_ratio(ours.timing, limit.timing)
    quartiles = timing.paired_ratio_quartiles(ours.timing, limit.timing)
    exact_text, exact_ok = _exactness(ours.diff, ulp_bound)
    row.update(measured=ratio, quartiles=quartiles, ours_median_ns=ours.timing.median_ns,
               limit_median_ns=limit.timing.median_ns, ours_spread=ours.timing.spread,
               limit_spread=limit.timing.spread, rounds=len(ours.timing.samples),
               exact=exact_text, exact_ok=exact_ok,
               diff=ours.diff.as_dict() if ours.diff else None,
               met=bool(ratio <= case.goal and exact_ok))
    return row


def measure_threads(n, *, small, rounds, target_ns, progress):
    """W1 out-of-place float32: 1 vs n threads, and n threads vs an n-thread copy."""
    label, speedup_goal, copy_goal = THREADS_GOAL
    label = label.format(n=n)
    row = {"workload": label, "key": "w1_oop", "dtype": "float32",
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
    exact_text, exact_ok = _exactness(diff, None)
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


def print_table(report):
    print(f"posenc_fast {report['build_info']['version']} goal table (issue 6) -- "
          f"{report['machine']}; {report['date']}")
    print(f"ISA {report['build_info']['isa_in_use']}, OpenMP "
          f"{'on' if report['build_info']['openmp'] else 'off'}, numpy {report['numpy']}, "
          f"python {report['python']}; {report['rounds']} interleaved rounds; measured = "
          f"median over rounds of time/limit (quartiles); 1 thread unless stated"
          f"{'; SMALL shapes' if report['small'] else ''}")
    head = ("workload", "shape", "dtype", "goal (time/limit)", "measured", "exact",
            "ours / limit", "met?")
    lines = []
    for row in report["rows"]:
        times = ""
        if row.get("ours_median_ns") is not None:
            times = (f"{timing.format_time(row['ours_median_ns'])} / "
                     f"{timing.format_time(row['limit_median_ns'])}")
        met = {True: "yes", False: "NO", None: "-"}[row.get("met")]
        lines.append((row["workload"], row["shape"], row["dtype"], row["goal"],
                      _measured_text(row),
                      row.get("exact", "-"), times, met))
    widths = [max(len(line[i]) for line in lines + [head]) for i in range(len(head))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in lines:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |")
    met = [r for r in report["rows"] if r.get("met") is not None]
    print(f"{sum(r['met'] for r in met)} of {len(met)} goals met.  'ours / limit' are the two "
          f"medians (context only: the claim is the ratio, measured interleaved).")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=31, help="interleaved rounds (default 31)")
    parser.add_argument("--quick", action="store_true", help="5 rounds of shorter samples")
    parser.add_argument("--small", action="store_true",
                        help="reduced shapes (smoke test; not the issue's workloads)")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    rounds = 5 if args.quick else args.rounds
    target_ns = 200_000 if args.quick else 1_000_000
    small = args.small or cases.small_from_environment()
    tty = sys.stderr.isatty()

    def progress(text):
        if tty:
            sys.stderr.write("\r" + text[:100].ljust(100))
            sys.stderr.flush()

    rows = []
    for label, key, dtype, ulp_bound in GOALS:
        if not tty:
            print(f"measuring {label} {dtype}", file=sys.stderr)
        rows.append(measure_goal(label, key, dtype, ulp_bound, small=small, rounds=rounds,
                                 target_ns=target_ns,
                                 progress=lambda t, label=label: progress(f"{label}: {t}")))
    if not tty:
        print("measuring threads", file=sys.stderr)
    rows.append(measure_threads(CORES, small=small, rounds=rounds, target_ns=target_ns,
                                progress=lambda t: progress(f"threads: {t}")))
    if tty:
        sys.stderr.write("\r" + " " * 100 + "\r")
    report = {
        "build_info": pf.build_info(), "numpy": np.__version__,
        "python": platform.python_version(), "machine": timing.machine_line(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="minutes"),
        "rounds": rounds, "small": small, "rows": rows,
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
