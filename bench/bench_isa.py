"""Kernel variants side by side: each built ISA variant's time / the limit, in one process.

    PYTHONPATH=src python3 bench/bench_isa.py [--rounds N] [--small] [--only KEY ...]
                                              [--variants avx2,avx512]

One thread.  For every workload of ``posenc_fast._bench.cases`` (and a few
rows this table adds: float16/bfloat16 W1, float32 rows of dim 100, which
keep NumPy's rows off every vector alignment) the call is timed once per
variant the CPU supports, switching the kernel table between samples
(``_core.use_kernels``), interleaved with its limit: each column is the
median over rounds of (variant's time / limit's time), and ``a/b`` the median
of the per-round ratio of the last two variants (e.g. avx512 / avx2; below
1: the wider variant is faster; ``--variants`` picks the columns).  This is
the measurement behind ``_dispatch.prefer_avx512`` (``--variants
avx2,avx512``) and behind ``avx512bf16`` before ``avx512`` (``--variants
avx512,avx512bf16 --only extra``).
"""

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

try:
    import posenc_fast as pf
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import posenc_fast as pf

from posenc_fast import _core, _dispatch
from posenc_fast._bench import cases
from posenc_fast._bench.timing import machine_line, measure, paired_ratio, paired_ratio_quartiles

WORKLOADS = [("w1_oop", "float32"), ("w1_oop", "float64"), ("w1_inplace", "float32"),
             ("w1_inplace", "float64"), ("w3_token", "float32"), ("w4_cos_sin", "float32"),
             ("w5_sinusoidal_131072x128", "float32"), ("w5_sinusoidal_8192x1024", "float32"),
             ("apply_qk", "float32"), ("alibi", "float32")]


def _variant_tables(wanted):
    """{name: kernel table capsule} of the vector variants built, supported and wanted, narrowest first."""
    tables = {}
    for name in reversed(_dispatch.PREFERENCE):
        if (name in _dispatch.BUILT and name in _dispatch.CPU_SUPPORTS and name != "baseline"
                and (not wanted or name in wanted)):
            tables[name] = _dispatch.variant_module(name).KERNELS
    return tables


def _extra_rows(small):
    """(label, ours, limit) for the rows the shared workloads lack (as bench_half.py's)."""
    seq = 256 if small else 4096
    rng = np.random.default_rng(0)
    rows = []
    for name, dtype in (("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16),
                        ("float32 dim 100", np.float32)):
        dim = 100 if "dim 100" in name else 128
        # NumPy has no vector loops for half types: their in-place limit is the copy.
        half = np.dtype(dtype).itemsize == 2
        rope = pf.RotaryEmbedding(dim, layout="half")
        x = rng.standard_normal((1, 32, seq, dim)).astype(dtype)
        out, dst = np.empty_like(x), np.empty_like(x)
        rows.append((f"W1 {name} out-of-place {cases.shape_label(x.shape)}",
                     lambda rope=rope, x=x, out=out: rope.apply(x, out=out),
                     lambda dst=dst, x=x: np.copyto(dst, x)))
        rows.append((f"W1 {name} in place {cases.shape_label(x.shape)}",
                     lambda rope=rope, out=out: rope.apply(out, out=out),
                     (lambda dst=dst, x=x: np.copyto(dst, x)) if half else
                     (lambda out=out: np.multiply(out, 1, out=out))))
    return rows


def _shared_rows(small, only):
    rows = []
    for key, dtype in WORKLOADS:
        if only and key not in only:
            continue
        case = cases.build_case(key, dtype, small)
        rows.append((f"{case.title} {dtype} {case.shape_label}", case.impl("posenc_fast").run,
                     case.impl("limit").run))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--small", action="store_true", help="the in-cache shapes")
    parser.add_argument("--only", nargs="*", default=(), help="workload keys, or 'extra'")
    parser.add_argument("--variants", default="", help="comma list of vector variants (default: all here)")
    args = parser.parse_args()
    pf.set_num_threads(1)
    tables = _variant_tables([name for name in args.variants.split(",") if name])
    if len(tables) < 2:
        print(f"fewer than two vector variants to compare here: {list(tables)}")
        return
    names = list(tables)
    print(f"{machine_line()}; one thread; time / limit, medians of {args.rounds} "
          f"interleaved rounds; {names[-1]}/{names[-2]} with its quartiles")
    rows = _shared_rows(args.small, args.only)
    if not args.only or "extra" in args.only:
        rows += _extra_rows(args.small)
    for label, ours, limit in rows:
        funcs = {**{f"ours {name}": ours for name in names}, "limit": limit}
        before = {f"ours {name}": (lambda t=tables[name]: _core.use_kernels(t))
                  for name in names}
        t = measure(funcs, rounds=args.rounds, before=before)
        ratios = "  ".join(f"{name} {paired_ratio(t['ours ' + name], t['limit']):5.2f}x"
                           for name in names)
        wide, narrow = t["ours " + names[-1]], t["ours " + names[-2]]
        q1, q3 = paired_ratio_quartiles(wide, narrow)
        print(f"{label:58s} {ratios}  {names[-1]}/{names[-2]} "
              f"{paired_ratio(wide, narrow):.2f} [{q1:.2f}-{q3:.2f}]", flush=True)


if __name__ == "__main__":
    main()
