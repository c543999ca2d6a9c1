"""pytest-benchmark plumbing for bench/: parameters, shared arrays, one run function.

Every benchmark is one point of the grid workload x impl x dtype x threads
(the shape is part of the workload), like an asv suite.  The workloads
themselves live in ``posenc_fast._bench.cases`` so that ``python -m posenc_fast
bench`` and ``bench/report.py`` time exactly the same arrays.

* ``benchmark.group`` is the workload, dtype and shape, so posenc_fast, the
  limit (``np.copyto`` / ``out.fill`` / ``np.multiply(x, 1, out=x)``), the
  NumPy expression and PyTorch sit side by side in one table.
* Arrays are built once per (workload, dtype) and the parameters are ordered
  so all tests of one case run together; only the current case is kept, so
  the 2 GiB ALiBi scores exist once, and never beside another big case.
* Each test first checks its implementation against the float64 reference
  (fails if it is wrong), then times it.  A posenc_fast test then times
  itself and the limit interleaved (`RATIO_ROUNDS` rounds of
  ``_bench.timing.measure``) and records the median ratio in
  ``extra_info["ratio_to_limit"]``: a ratio from one run, unlike two
  pytest-benchmark medians taken minutes apart (not with
  ``--benchmark-disable``).
* Shapes are the real ones of issue 6.  ``--bench-small`` or
  ``POSENC_FAST_BENCH_SMALL=1`` shrinks the big workloads; with
  ``--benchmark-disable`` (the CI smoke run) only workloads marked ``big``
  (add_alibi, 2 GiB) shrink.
"""

import os
from dataclasses import dataclass

import pytest

import posenc_fast as pf
from posenc_fast._bench import cases, timing

RATIO_ROUNDS = 7
THREADS_N = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else (os.cpu_count() or 1))


def pytest_addoption(parser):
    group = parser.getgroup("posenc_fast", "posenc_fast benchmarks")
    group.addoption("--bench-small", action="store_true", default=False,
                    help="posenc_fast bench/: use reduced shapes for the big workloads "
                         "(also POSENC_FAST_BENCH_SMALL=1)")


def _small(config, key: str) -> bool:
    if config.getoption("--bench-small") or cases.small_from_environment():
        return True
    disabled = bool(config.getoption("benchmark_disable", default=False))
    return disabled and cases.WORKLOADS[key].big


@dataclass(frozen=True)
class BenchParam:
    """One point of the grid."""

    key: str
    dtype: str
    kind: str
    threads: int


def pytest_generate_tests(metafunc):
    """Parametrise ``bench_param`` over the workloads a module lists in BENCH_WORKLOADS."""
    if "bench_param" not in metafunc.fixturenames:
        return
    params, ids = [], []
    for key in metafunc.module.BENCH_WORKLOADS:
        workload = cases.WORKLOADS[key]
        shape = workload.small_shape if _small(metafunc.config, key) else workload.shape
        shape_label = cases.shape_label(shape)
        for dtype in workload.dtypes:
            for kind in workload.kinds:
                thread_counts = [1]
                if kind == "posenc_fast" and workload.threaded and THREADS_N > 1:
                    thread_counts.append(THREADS_N)
                for threads in thread_counts:
                    params.append(BenchParam(key, dtype, kind, threads))
                    ids.append(f"{key}-{shape_label}-{dtype}-{kind}-t{threads}")
    metafunc.parametrize("bench_param", params, ids=ids)


class CaseCache:
    """The case of the test running now (arrays built once; the previous case dropped)."""

    def __init__(self, config):
        self.config = config
        self.current = None

    def get(self, key: str, dtype: str) -> cases.Case:
        if self.current is None or self.current[0] != (key, dtype):
            self.current = None  # free the old arrays before building the new ones
            case = cases.build_case(key, dtype, _small(self.config, key))
            self.current = ((key, dtype), case)
        return self.current[1]


@pytest.fixture(scope="session")
def bench_cases(request):
    return CaseCache(request.config)


@pytest.fixture(scope="session")
def build_facts():
    return pf.build_info()


@pytest.fixture
def bench_run(benchmark, bench_cases, build_facts):
    """Return ``run(param)``: check one grid point against the reference, then time it."""

    def run(param: BenchParam):
        case = bench_cases.get(param.key, param.dtype)
        try:
            impl = case.impl(param.kind)
        except cases.Unavailable as exc:
            pytest.skip(str(exc))
        benchmark.group = f"{case.title} | {case.dtype.name} | {case.shape_label}"
        benchmark.extra_info.update({
            "workload": case.key, "impl": param.kind, "label": impl.label,
            "dtype": case.dtype.name, "shape": str(case.shape), "threads": param.threads,
            "bytes_moved": case.bytes_moved, "limit": case.limit_label, "goal": case.goal_text,
            "build_info": build_facts,
        })
        with timing.restored_threads():
            timing.set_threads(param.threads)
            diff = impl.verify()      # raises AssertionError if a limit row is wrong
            if diff is not None:
                benchmark.extra_info.update(diff.as_dict())
                assert diff.ok, (f"{impl.label} on {case.title} {case.dtype.name}: max |diff| "
                                 f"{diff.max_abs:.3g} (relative {diff.max_rel:.3g}) is "
                                 f"{diff.tolerance_used:.3g}x the tolerance")
            benchmark(impl.run)
            if param.kind == "posenc_fast" and not getattr(benchmark, "disabled", False):
                timings = timing.measure({"ours": impl.run, "limit": case.impl("limit").run},
                                         rounds=RATIO_ROUNDS, target_ns=200_000)
                benchmark.extra_info.update(
                    ratio_to_limit=timing.paired_ratio(timings["ours"], timings["limit"]),
                    ratio_to_limit_quartiles=timing.paired_ratio_quartiles(
                        timings["ours"], timings["limit"]),
                    ratio_rounds=RATIO_ROUNDS)
        stats = getattr(benchmark, "stats", None)
        if stats is not None and getattr(stats, "stats", None) is not None:
            median = stats.stats.median
            if median > 0:
                benchmark.extra_info["gb_per_s"] = case.bytes_moved / median / 1e9

    return run
