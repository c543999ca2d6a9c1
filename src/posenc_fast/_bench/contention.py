"""Threads never hurt (issue 19): per-call p50/p99 with the default thread count vs one thread.

For each call of `CALLS`, beside each neighbour of `NEIGHBOURS` (none, a
CPU-bound process at nice 0, one at nice 19), single calls at the default
thread count and at one thread are timed in interleaved blocks
(`timing.per_call_times`); the goal is p50 <= `P50_GOAL` and p99 <=
`P99_GOAL` times one thread's.  The row without a neighbour is context:
the issue's goal is stated beside a busy one.  Each row also counts what the
pool's back-off did meanwhile (csrc/posenc_pool.h): late calls, and calls
run on fewer threads than asked.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

from .._dispatch import kernels
from . import cases, timing
from .neighbours import KINDS, Neighbour

# (label, workload, shape or None for the workload's own); float32
CALLS = (
    ("W1 out-of-place, 4 MiB", "w1_oop", (1, 32, 256, 128)),
    ("W1 out-of-place, 64 MiB", "w1_oop", None),
    ("W2 decode step", "w2_decode", None),
)
NEIGHBOURS = (None, ("busy", 0), ("busy", 19))
P50_GOAL, P99_GOAL = 1.1, 2.0
KINDS_TEXT = KINDS["busy"]


def neighbour_label(neighbour) -> str:
    if neighbour is None:
        return "none"
    kind, nice = neighbour
    return f"{kind}, nice {nice}"


def measure(default_threads: int, *, calls: int, budget_s: float,
            progress: Callable[[str], None] | None = None) -> list[dict]:
    """One row per (call, neighbour): percentiles in ns, their ratios, met or not."""
    rows = []
    for label, key, shape in CALLS:
        case = cases.build_case(key, "float32", shape=shape)
        impl = case.impl("posenc_fast")
        with timing.restored_threads():
            exact = True
            for n in {1, default_threads}:
                timing.set_threads(n)
                exact = exact and impl.verify().ok
        for neighbour in NEIGHBOURS:
            row = {"call": label, "shape": cases.shape_label(case.shape), "dtype": "float32",
                   "neighbour": neighbour_label(neighbour), "default_threads": default_threads,
                   "exact_ok": exact}
            rows.append(row)
            if default_threads == 1:
                row.update(met=None, note="the default is one thread: nothing to compare")
                continue
            if progress is not None:
                progress(f"{label}, neighbour {row['neighbour']}")
            pool_before = kernels.pool_counts()
            with Neighbour(*neighbour) if neighbour else nullcontext() as process:
                times = timing.per_call_times(
                    {"default": impl.run, "one": impl.run}, calls=calls, budget_s=budget_s,
                    before={"default": lambda: timing.set_threads(default_threads),
                            "one": lambda: timing.set_threads(1)})
            for name in ("default", "one"):
                for q in (50, 99):
                    row[f"p{q}_{name}_ns"] = timing.percentile(times[name], q)
            pool = kernels.pool_counts()
            row.update(late_calls=pool["late"] - pool_before["late"],
                       backed_off_calls=pool["capped"] - pool_before["capped"])
            p50 = row["p50_default_ns"] / row["p50_one_ns"]
            p99 = row["p99_default_ns"] / row["p99_one_ns"]
            row.update(calls=len(times["one"]), p50_ratio=p50, p99_ratio=p99,
                       neighbour_ran=process.summary() if process else None,
                       met=bool(p50 <= P50_GOAL and p99 <= P99_GOAL and exact))
        del case, impl
    return rows
