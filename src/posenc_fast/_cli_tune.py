"""``python -m posenc_fast tune``: time the kernel variants on this machine and store the choice.

Every variant gives bitwise the same results; which is fastest depends on
the CPU (`_dispatch.prefer_avx512` holds the CPUs measured so far).  ``tune``
times the widest AVX-512 variant against AVX2 on a few workloads (one thread,
interleaved rounds, the kernel table switched between samples), and writes
the faster one under this CPU's name into the tuning file
(`_dispatch.tune_file`), which the next import reads.  ``POSENC_FAST_ISA``
still overrides it.
"""

import argparse
import math

import ml_dtypes
import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``tune``."""
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per workload")
    parser.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")


def _workloads():
    """(label, call) pairs: in-cache and from-memory rotations, half types, a one-token step."""
    import posenc_fast as pf

    rng = np.random.default_rng(0)
    rope = pf.RotaryEmbedding(128, layout="half")
    rows = []
    for dtype, seq in ((np.float32, 32), (np.float32, 4096), (ml_dtypes.bfloat16, 1024),
                       (np.float16, 256)):
        x = rng.standard_normal((1, 32, seq, 128)).astype(dtype)
        out = np.empty_like(x)
        name = f"{np.dtype(dtype).name} (1,32,{seq},128)"
        rows.append((f"W1 out-of-place {name}", lambda x=x, out=out: rope.apply(x, out=out)))
        rows.append((f"W1 in place {name}", lambda out=out: rope.apply(out, out=out)))
    token = rng.standard_normal((1, 32, 1, 128)).astype(np.float32)
    rows.append(("W3 one token float32", lambda: rope.apply(token, offset=4096, out=token)))
    return rows


def measure_variants(names, rounds):
    """{label: median of per-round time ratios names[1] / names[0]} over the workloads."""
    from . import _core, _dispatch
    from ._bench.timing import measure, paired_ratio

    tables = {name: _dispatch.variant_module(name).KERNELS for name in names}
    ratios = {}
    try:
        for label, call in _workloads():
            funcs = {name: call for name in names}
            before = {name: (lambda t=tables[name]: _core.use_kernels(t)) for name in names}
            t = measure(funcs, rounds=rounds, before=before)
            ratios[label] = round(paired_ratio(t[names[1]], t[names[0]]), 3)
    finally:
        _core.use_kernels(tables[_dispatch.ISA_IN_USE])
    return ratios


def run(args: argparse.Namespace) -> int:
    """Measure, print, and (unless --dry-run) store the faster variant for this CPU."""
    from . import _cpu, _dispatch, set_num_threads, get_num_threads

    usable = [name for name in _dispatch.PREFERENCE
              if name in _dispatch.BUILT and name in _dispatch.CPU_SUPPORTS and name != "baseline"]
    cpu = _cpu.cpu_identity()
    wide = [name for name in usable if name in _dispatch.AVX512]
    if not wide or "avx2" not in usable:
        print(f"{_dispatch.cpu_key(cpu)}: not both AVX-512 and AVX2 usable here "
              f"({usable or 'no vector variant'}): nothing to choose")
        return 0
    names = ["avx2", wide[0]]  # narrower, wider
    threads = get_num_threads()
    set_num_threads(1)
    try:
        ratios = measure_variants(names, args.rounds)
    finally:
        set_num_threads(threads)
    for label, ratio in ratios.items():
        print(f"{label:40s} {names[1]}/{names[0]} {ratio:.3f}")
    mean = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
    choice = names[1] if mean < 1.0 else names[0]
    print(f"{_dispatch.cpu_key(cpu)}: geometric mean {names[1]}/{names[0]} {mean:.3f}: {choice}")
    if args.dry_run:
        return 0
    path = _dispatch.tune_file()
    try:
        old = path.read_text()
    except OSError:
        old = None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dispatch.with_tuned_variant(old, cpu, choice, ratios))
    print(f"written to {path} (read at the next import; {_dispatch.ENV_VAR} overrides it)")
    return 0
