"""The one timing loop: callables timed in interleaved rounds, medians and quartiles of ratios.

Rules (`measure`): every callable is warmed up, the callables are timed in
interleaved rounds, each round in an order of its own (a seeded shuffle: each
callable follows each other about as often, whatever its place in the
mapping -- a rotation kept their cyclic order, so with three or more one
always ran right after the same one, on the caches it left), a sample
holds enough calls to last `target_ns`, times come from
``time.perf_counter_ns``.  Claims are medians over rounds of per-round
ratios (`paired_ratio`) measured in the same process, never a single
absolute time.  `per_call_times` times single calls instead, for the
percentiles of the contention table (bench/report.py --contention).
"""

from __future__ import annotations

import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .. import _threads


def calibrate(func: Callable[[], object], target_ns: int) -> int:
    """Return how many calls of `func` make one sample of about `target_ns`."""
    start = time.perf_counter_ns()
    func()
    elapsed = max(time.perf_counter_ns() - start, 1)
    number = 1
    while elapsed * number < target_ns // 4 and number < 1 << 20:
        number *= 2          # the first call may be slow: re-time a batch
        start = time.perf_counter_ns()
        for _ in range(number):
            func()
        elapsed = max((time.perf_counter_ns() - start) // number, 1)
    return max(1, min(1 << 20, math.ceil(target_ns / elapsed)))


@dataclass
class Timing:
    """Per-call times (ns) of one callable, one entry per interleaved round."""

    samples: list[float]
    number: int

    @property
    def median_ns(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """(q3 - q1) / median of the samples: how noisy the rounds were."""
        if len(self.samples) < 4:
            return 0.0
        q = statistics.quantiles(self.samples, n=4)
        return (q[2] - q[0]) / self.median_ns


def measure(funcs: Mapping[str, Callable[[], object]], *, rounds: int = 15,
            target_ns: int = 1_000_000, warmup: int = 1,
            before: Mapping[str, Callable[[], object]] | None = None,
            progress: Callable[[str], None] | None = None,
            budget_s: float | None = None, min_rounds: int = 3) -> dict[str, Timing]:
    """Time `funcs` in interleaved rounds; return a `Timing` per name.

    Parameters
    ----------
    funcs : mapping of name to a callable without arguments
    rounds : int
        Samples per callable.
    target_ns : int
        Each sample repeats the call enough times to last about this long
        (tiny calls are otherwise below the clock's resolution).
    warmup : int
        Untimed calls of each callable before the one that calibrates it.
    before : mapping of name to a callable, optional
        Run (untimed) before every sample of that name, e.g. to set a thread
        count; thread counts of posenc_fast and torch are restored at the end.
    progress : callable taking a str, optional
        Told "round i/n" as the rounds go.
    budget_s : float, optional
        Stop after `min_rounds` rounds once this many seconds have passed
        (a slow baseline on a busy machine must not stall a quick run).
    """
    before = dict(before or {})
    names = list(funcs)
    with restored_threads():
        numbers = {}
        for name in names:
            if name in before:
                before[name]()
            for _ in range(warmup):
                funcs[name]()
            numbers[name] = calibrate(funcs[name], target_ns)
        samples: dict[str, list[float]] = {name: [] for name in names}
        shuffled = random.Random(0)  # the rounds' orders, the same in every run
        clock = time.perf_counter_ns
        started = clock()
        for r in range(rounds):
            if (budget_s is not None and r >= min_rounds
                    and clock() - started > budget_s * 1e9):
                break
            if progress is not None:
                progress(f"round {r + 1}/{rounds}")
            order = list(names)
            shuffled.shuffle(order)
            for name in order:
                if name in before:
                    before[name]()
                func, number = funcs[name], numbers[name]
                if number == 1:
                    start = clock()
                    func()
                    elapsed = clock() - start
                else:
                    start = clock()
                    for _ in range(number):
                        func()
                    elapsed = clock() - start
                samples[name].append(elapsed / number)
    return {name: Timing(samples[name], numbers[name]) for name in names}


def per_call_times(funcs: Mapping[str, Callable[[], object]], *, calls: int, block: int = 8,
                   before: Mapping[str, Callable[[], object]] | None = None,
                   budget_s: float | None = None, min_calls: int = 100) -> dict[str, list[int]]:
    """Time single calls of `funcs` in interleaved blocks; return each one's per-call times (ns).

    For percentiles (a p99 is a property of single calls, not of batches):
    blocks of `block` calls of each function take turns (a, b, b, a, a,
    b, ...: the first of each pair of blocks alternates) until each has
    made `calls` calls, or `min_calls` once `budget_s` seconds have passed.
    ``before[name]()`` runs untimed before each of that name's blocks.  The
    functions are warmed up once; the garbage collector is off meanwhile.
    """
    import gc

    before = dict(before or {})
    names = list(funcs)
    samples: dict[str, list[int]] = {name: [] for name in names}
    clock = time.perf_counter_ns
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with restored_threads():
            for name in names:
                if name in before:
                    before[name]()
                funcs[name]()
            started = clock()
            turn = 0
            while len(samples[names[0]]) < calls:
                if (budget_s is not None and len(samples[names[0]]) >= min_calls
                        and clock() - started > budget_s * 1e9):
                    break
                order = names if turn % 2 == 0 else names[::-1]
                turn += 1
                for name in order:
                    if name in before:
                        before[name]()
                    func, times = funcs[name], samples[name]
                    for _ in range(block):
                        start = clock()
                        func()
                        times.append(clock() - start)
    finally:
        if collecting:
            gc.enable()
    return samples


def percentile(samples, q: float) -> float:
    """The `q`-th percentile (0-100) of `samples`, linearly interpolated."""
    return float(np.percentile(np.asarray(samples, dtype=np.float64), q))


def joined(parts: list[Timing]) -> Timing:
    """One callable's rounds timed on several placements of its arrays, as one Timing.

    The rounds keep their order, so two joined Timings of callables timed
    side by side still pair round for round (`paired_ratio`).
    """
    return Timing([sample for part in parts for sample in part.samples], parts[0].number)


def paired_ratio(a: Timing, b: Timing) -> float:
    """Median over rounds of a's time / b's time (rounds were interleaved)."""
    return statistics.median(x / y for x, y in zip(a.samples, b.samples))


def paired_ratio_quartiles(a: Timing, b: Timing) -> tuple[float, float]:
    """First and third quartiles over rounds of a's time / b's time: how noisy the ratio is."""
    ratios = [x / y for x, y in zip(a.samples, b.samples)]
    if len(ratios) < 4:
        return min(ratios), max(ratios)
    q = statistics.quantiles(ratios, n=4)
    return q[0], q[2]


def _torch_if_imported():
    return sys.modules.get("torch")


class restored_threads:
    """Context manager: restore posenc_fast's (and torch's, if imported) thread counts."""

    def __enter__(self):
        self.ours = _threads.get_num_threads()
        torch = _torch_if_imported()
        self.torch = torch.get_num_threads() if torch is not None else None
        return self

    def __exit__(self, *exc):
        _threads.set_num_threads(self.ours)
        torch = _torch_if_imported()
        if torch is not None and self.torch is not None:
            torch.set_num_threads(self.torch)
        return False


def set_threads(n: int) -> None:
    """Set the thread count of posenc_fast and, if imported, of torch."""
    _threads.set_num_threads(n)
    torch = _torch_if_imported()
    if torch is not None:
        torch.set_num_threads(n)


class ParallelCopy:
    """``np.copyto(dst, src)`` split over `n` threads (NumPy drops the GIL while copying).

    The copy limit for a multi-threaded call: the memory bandwidth `n` cores get.
    """

    def __init__(self, dst: np.ndarray, src: np.ndarray, n: int):
        flat_dst, flat_src = dst.reshape(-1), src.reshape(-1)
        bounds = np.linspace(0, flat_dst.size, n + 1).astype(int)
        self.parts = [(flat_dst[a:b], flat_src[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        self.pool = ThreadPoolExecutor(max_workers=n)

    def __call__(self) -> None:
        for future in [self.pool.submit(np.copyto, d, s) for d, s in self.parts]:
            future.result()

    def close(self) -> None:
        self.pool.shutdown()


def format_time(ns: float) -> str:
    """A duration with a unit a person reads at a glance."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def machine_line() -> str:
    """``<CPU model>, <n> cores`` (Linux), or the platform's processor string."""
    import platform

    model = None
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model or platform.processor() or platform.machine()}, {os.cpu_count()} cores"


@dataclass
class Row:
    """One implementation of a case, checked and timed."""

    kind: str
    label: str
    timing: Timing
    diff: object  # cases.Diff, or None for a limit row


def time_case(case, kinds, *, rounds: int, target_ns: int, warmup: int = 1,
              threads: Mapping[str, int] | None = None,
              progress: Callable[[str], None] | None = None,
              budget_s: float | None = None) -> tuple[dict[str, Row], dict]:
    """Check, then time the `kinds` of a `cases.Case` interleaved; skip the unavailable ones.

    `threads` maps a kind to the thread count set before each of its samples.
    Returns ``(rows by kind, {kind: reason} for the kinds skipped)``.
    """
    from .torch_rows import Unavailable

    impls, skipped = {}, {}
    for kind in kinds:
        if progress is not None:
            progress(f"{kind}: setup and check")
        try:
            impls[kind] = case.impl(kind)
        except Unavailable as exc:
            skipped[kind] = str(exc)
    diffs = {}
    with restored_threads():
        for kind, impl in impls.items():
            if threads and kind in threads:
                set_threads(threads[kind])
            diffs[kind] = impl.verify()
    before = {kind: (lambda n=n: set_threads(n)) for kind, n in (threads or {}).items()
              if kind in impls}
    timings = measure({kind: impl.run for kind, impl in impls.items()}, rounds=rounds,
                      target_ns=target_ns, warmup=warmup, before=before, progress=progress,
                      budget_s=budget_s)
    rows = {kind: Row(kind, impl.label, timings[kind], diffs[kind]) for kind, impl in impls.items()}
    return rows, skipped
