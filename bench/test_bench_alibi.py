"""ALiBi benchmark: ``add_alibi(scores, out=scores)`` on (32, 4096, 4096) float32 scores (2 GiB).

The scores are allocated once; the ``--benchmark-disable`` smoke run
and ``--bench-small`` use (32, 256, 256).  Grid and checks: see conftest.py.
"""

BENCH_WORKLOADS = ("alibi",)


def test_alibi(bench_run, bench_param):
    bench_run(bench_param)
