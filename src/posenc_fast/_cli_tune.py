"""``python -m posenc_fast tune``: time the kernel variants and the walks' block sizes on this
machine and store the choices.

Every variant and every block size gives bitwise the same results; which is
fastest depends on the CPU (`_dispatch.prefer_avx512` and
`_dispatch.block_bytes` hold the CPUs measured so far).  ``tune`` times the
widest AVX-512 variant against AVX2 on a few workloads, then, with the
faster one, each block size against the values measured best on the CPUs of
those tables (one thread, interleaved rounds, the kernel table or the size
switched between samples), and writes the choices under this CPU's name into
the tuning file (`_dispatch.tune_file`), which the next import reads.
``POSENC_FAST_ISA`` still overrides the variant, a size the build was given
(``-DPOSENC_..._BYTES``) a block size.
"""

import argparse
import math

import ml_dtypes
import numpy as np

# Each block size's candidates: the values measured best on AMD Zen 5, Zen 4 and Intel model 0xA7 (bench/sweeps.md).
BLOCK_CANDIDATES = {"position": (512 << 10, 4 << 20), "row": (8 << 10, 16 << 10), "group": (0, 768),
                    "group_interleaved": (0, 2048), "scalar_in_place": (512, 4096),
                    "add": (0, 256 << 10), "stream": (16 << 20, 48 << 20), "lines": (0, 2 << 20)}
# Another block size replaces the one in use only where it runs at most this fraction of its time:
# a choice within the noise of a few rounds is no choice.
MARGIN = 0.97


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``tune``."""
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per workload")
    parser.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")


def _rotations(specs, layout="half"):
    """(label, call) pairs of RotaryEmbedding.apply: `specs` of (dtype, shape, in_place)."""
    import posenc_fast as pf

    rows = []
    for dtype, shape, in_place in specs:
        rope = pf.RotaryEmbedding(shape[-1], layout=layout)
        x = np.full(shape, 0.5, dtype)
        out = x if in_place else np.empty_like(x)
        name = f"W1 {layout} {'in place' if in_place else 'out-of-place'} {np.dtype(dtype).name} {shape}"
        rows.append((name, lambda x=x, out=out, rope=rope: rope.apply(x, out=out)))
    return rows


def _variant_workloads():
    """(label, call) pairs: in-cache and from-memory rotations, half types, a one-token step."""
    import posenc_fast as pf

    rows = _rotations([(dtype, (1, 32, seq, 128), in_place)
                       for dtype, seq in ((np.float32, 32), (np.float32, 4096), (ml_dtypes.bfloat16, 1024),
                                          (np.float16, 256))
                       for in_place in (False, True)])
    rope = pf.RotaryEmbedding(128, layout="half")
    token = np.full((1, 32, 1, 128), 0.5, np.float32)
    rows.append(("W3 one token float32", lambda: rope.apply(token, offset=4096, out=token)))
    return rows


def _block_workloads(kind):
    """(label, call) pairs the walks of block size `kind` take."""
    f32, f64, f16, bf16 = np.float32, np.float64, np.float16, ml_dtypes.bfloat16
    if kind == "position":  # in place past the caches
        return _rotations([(f32, (1, 32, 4096, 128), True), (f64, (1, 32, 2048, 128), True),
                           (bf16, (1, 32, 4096, 128), True), (f32, (1, 32, 2048, 256), True)])
    if kind == "row":  # below them
        return _rotations([(f32, (1, 32, 256, 128), False), (f32, (1, 32, 32, 128), False),
                           (f32, (1, 32, 256, 128), True), (bf16, (1, 32, 256, 128), False)])
    if kind == "group":  # half-layout rows in groups
        return _rotations([(f32, (1, 32, 4096, 128), False), (f32, (1, 32, 4096, 128), True),
                           (f32, (1, 32, 2730, 192), True), (bf16, (1, 32, 4096, 128), False)])
    if kind == "add":  # add_position_table over batches at the same positions
        import posenc_fast as pf

        rows = []
        for shape in ((8, 2048, 1024), (4, 4096, 512)):
            x = np.full(shape, 0.5, np.float32)
            table = np.full(shape[1:], 0.25, np.float32)
            rows.append((f"add_position_table in place float32 {shape}",
                         lambda x=x, table=table: pf.add_position_table(x, table, out=x)))
        return rows
    if kind == "stream":  # out-of-place results between the candidates (32, 40 MiB), each into the last one's
        return _rotations([(bf16, (1, 32, 4096, 128), False), (f32, (1, 32, 2560, 128), False),
                           (f16, (1, 32, 4096, 128), False)])
    if kind == "lines":  # half-type results out of place past L2, below the streams (NumPy's: off a line)
        return _rotations([(bf16, (1, 32, 4096, 128), False), (f16, (1, 32, 4096, 128), False),
                           (bf16, (1, 32, 256, 128), False), (bf16, (1, 32, 2048, 256), False)])
    if kind == "scalar_in_place":  # half-layout rows in place past the caches, of 512 bytes to 2 KiB
        return _rotations([(f32, (1, 32, 4096, 128), True), (f64, (1, 32, 2048, 128), True),
                           (f32, (1, 32, 2730, 192), True), (f64, (1, 32, 1024, 256), True)])
    return _rotations([(f32, (1, 32, 4096, 128), False), (f32, (1, 32, 2048, 256), True),  # interleaved
                       (f64, (1, 32, 2048, 128), False), (bf16, (1, 32, 4096, 128), True)], "interleaved")


def _geometric_mean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def pick(current, ratios, margin=MARGIN):
    """The block size to use: the candidate of the least ratio where it is below `margin`, else `current`.

    Parameters
    ----------
    current : int
        The size in use.
    ratios : dict of int to float
        Each other candidate's time over `current`'s (a geometric mean over workloads).
    """
    best = min(ratios, key=ratios.get, default=current)
    return best if ratios.get(best, 1.0) < margin else current


def measure_variants(names, rounds):
    """{label: median of per-round time ratios names[1] / names[0]} over the workloads."""
    from . import _core, _dispatch
    from ._bench.timing import measure, paired_ratio

    tables = {name: _dispatch.variant_module(name).KERNELS for name in names}
    ratios, in_use = {}, _core.kernels_in_use()
    try:
        for label, call in _variant_workloads():
            funcs = {name: call for name in names}
            before = {name: (lambda t=tables[name]: _core.use_kernels(t)) for name in names}
            t = measure(funcs, rounds=rounds, before=before)
            ratios[label] = round(paired_ratio(t[names[1]], t[names[0]]), 3)
    finally:
        _core.use_kernels(in_use)
    return ratios


def measure_blocks(rounds):
    """({kind: size chosen}, {kind: {candidate: {label: ratio to the size in use}}}) for the
    kinds the build was not given, each measured with the sizes chosen before it."""
    from . import _core
    from ._bench.timing import measure, paired_ratio
    from ._dispatch import BLOCK_KINDS as order

    sizes = {kind: _core.block_bytes()[kind][0] for kind in order}
    chosen, ratios = {}, {}

    def use(kind, size):
        _core.set_block_bytes(**dict(sizes, **{kind: size}))

    before = dict(sizes)
    try:
        for kind in order:
            if _core.block_bytes()[kind][1]:
                continue  # the build's size stands
            current = sizes[kind]
            candidates = sorted(set(BLOCK_CANDIDATES[kind]) | {current})
            ratios[kind] = {size: {} for size in candidates if size != current}
            for label, call in _block_workloads(kind):
                t = measure({size: call for size in candidates}, rounds=rounds,
                            before={size: (lambda s=size: use(kind, s)) for size in candidates})
                for size in ratios[kind]:
                    ratios[kind][size][label] = round(paired_ratio(t[size], t[current]), 3)
            chosen[kind] = sizes[kind] = pick(
                current, {size: _geometric_mean(r.values()) for size, r in ratios[kind].items()})
    finally:
        _core.set_block_bytes(**before)
    return chosen, ratios


def run(args: argparse.Namespace) -> int:
    """Measure, print, and (unless --dry-run) store this CPU's variant and block sizes."""
    from . import _core, _cpu, _dispatch, get_num_threads, set_num_threads

    if args.rounds < 1:
        raise SystemExit(f"tune: --rounds must be >= 1, got {args.rounds}")
    usable = [name for name in _dispatch.PREFERENCE
              if name in _dispatch.BUILT and name in _dispatch.CPU_SUPPORTS and name != "baseline"]
    cpu = _cpu.cpu_identity()
    wide = [name for name in usable if name in _dispatch.AVX512]
    entry, in_use = {}, _core.kernels_in_use()
    threads = get_num_threads()
    set_num_threads(1)
    try:
        if wide and "avx2" in usable:
            names = ["avx2", wide[0]]  # narrower, wider
            ratios = measure_variants(names, args.rounds)
            for label, ratio in ratios.items():
                print(f"{label:40s} {names[1]}/{names[0]} {ratio:.3f}")
            mean = _geometric_mean(ratios.values())
            entry = {"variant": names[1] if mean < 1.0 else names[0], "ratios": ratios}
            print(f"{_dispatch.cpu_key(cpu)}: geometric mean {names[1]}/{names[0]} {mean:.3f}: "
                  f"{entry['variant']}")
            _core.use_kernels(_dispatch.variant_module(entry["variant"]).KERNELS)
        else:
            print(f"{_dispatch.cpu_key(cpu)}: not both AVX-512 and AVX2 usable here "
                  f"({usable or 'no vector variant'}): no variant to choose")
        blocks, block_ratios = measure_blocks(args.rounds)
    finally:
        set_num_threads(threads)
        _core.use_kernels(in_use)
    for kind, by_size in block_ratios.items():
        for size, by_label in by_size.items():
            for label, ratio in by_label.items():
                print(f"{kind} block {size} bytes / {_core.block_bytes()[kind][0]}: {label:40s} {ratio:.3f}")
        print(f"{kind} block: {blocks[kind]} bytes")
    if blocks:
        entry.update(blocks=blocks, block_ratios={kind: {str(size): r for size, r in by_size.items()}
                                                  for kind, by_size in block_ratios.items()})
    if args.dry_run or not entry:
        return 0
    path = _dispatch.tune_file()
    try:
        old = path.read_text()
    except OSError:
        old = None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dispatch.with_tuned(old, cpu, entry))
    print(f"written to {path} (read at the next import; {_dispatch.ENV_VAR} overrides the variant)")
    return 0
