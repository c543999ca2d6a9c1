"""Table benchmarks: W4 ``RotaryEmbedding.cos_sin`` and W5 ``sinusoidal_table`` (two shapes).

Grid and checks: see conftest.py; workloads: ``posenc_fast._bench.cases``.
"""

BENCH_WORKLOADS = ("w4_cos_sin", "w5_sinusoidal_131072x128", "w5_sinusoidal_8192x1024")


def test_table(bench_run, bench_param):
    bench_run(bench_param)
