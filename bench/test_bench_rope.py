"""RoPE benchmarks: W1 prefill (out-of-place and in place), W2 decode step, W3 one token, apply_qk.

Grid and checks: see conftest.py; workloads: ``posenc_fast._bench.cases``.
"""

BENCH_WORKLOADS = ("w1_oop", "w1_inplace", "w2_decode", "w3_token", "apply_qk")


def test_rope(bench_run, bench_param):
    bench_run(bench_param)
