"""The benchmark code: the standard workloads and the one loop that times them.

Shared by ``python -m posenc_fast bench`` (``_cli_bench``), ``bench/report.py``,
``bench/ratios.py``, ``bench/bench_hf.py`` and the pytest-benchmark suite in
``bench/``.  It lives in the package (not in ``bench/``) because the CLI must
work from an installed wheel.

``timing``      the interleaved timing loop (medians and quartiles of ratios);
``cases``       the workloads as data and the one builder of their cases;
``torch_rows``  the optional PyTorch and ``torch.compile`` rows;
``neighbours``  the processes beside a measurement (a memory-bandwidth hog, a busy loop);
``contention``  per-call p50/p99, default threads vs one, beside a busy process.

Nothing here imports torch unless a torch row is asked for.
"""
