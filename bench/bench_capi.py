"""The C API's one-token rotation against a memcpy, both from compiled code.

    python3 bench/bench_capi.py [--rounds N] [--reps R]

Issue 18's goal: a one-token rotation (1, 32, 1, 128) float32 ("half"
layout, dim 128, offset 4096: bench case W3) through ``rotate_rotary`` from
a compiled loop takes <= 1.5x a ``memcpy`` of the same bytes from a compiled
loop.  Both loops (R calls each, without the GIL) live in the test probe
``tests/capi/capi_probe_c.c``, built here into a temporary folder; the same
rotation through Python (``RotaryEmbedding.apply``) is timed beside them.
Times are medians over interleaved rounds (``posenc_fast._bench.timing``),
the ratio the median of per-round ratios; one thread.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
try:
    import posenc_fast as pf
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(ROOT / "src"))
    import posenc_fast as pf
sys.path.insert(0, str(ROOT / "tests" / "capi"))
import build as probe_build  # noqa: E402

from posenc_fast._bench.timing import format_time, machine_line, measure, paired_ratio  # noqa: E402

SHAPE = (1, 32, 1, 128)
OFFSET = 4096


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--reps", type=int, default=2000, help="calls per compiled loop")
    args = parser.parse_args()
    if not probe_build.have_compiler():
        sys.exit("bench_capi needs a C compiler")
    with tempfile.TemporaryDirectory() as folder:
        probe = probe_build.build("capi_probe_c", Path(folder))
    rope = pf.RotaryEmbedding(SHAPE[-1], layout="half")
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    out = np.empty_like(x)
    capsule = pf.rotary_table_capsule(rope, OFFSET + 1)
    outer, dim, reps = SHAPE[0] * SHAPE[1], SHAPE[-1], args.reps
    status = probe.repeat_rotate_rotary(capsule, x.ctypes.data, out.ctypes.data, outer, 1, dim,
                                        OFFSET, 1)
    assert status == 0, probe.status_message(status)
    assert out.tobytes() == rope.apply(x, offset=OFFSET).tobytes(), "C API result differs"

    pf.set_num_threads(1)
    timings = measure({
        "c_api": lambda: probe.repeat_rotate_rotary(capsule, x.ctypes.data, out.ctypes.data,
                                                    outer, 1, dim, OFFSET, reps),
        "memcpy": lambda: probe.repeat_memcpy(out.ctypes.data, x.ctypes.data, x.nbytes, reps),
        "python": lambda: rope.apply(x, offset=OFFSET, out=out),
    }, rounds=args.rounds)
    per_call = {name: t.median_ns / (1 if name == "python" else reps)
                for name, t in timings.items()}
    print(machine_line())
    print(f"one-token rotation {SHAPE} float32, offset {OFFSET}, {reps} calls per compiled loop, "
          f"{args.rounds} rounds")
    for name, label in (("c_api", "C API rotate_rotary (compiled loop)"),
                        ("memcpy", f"memcpy of {x.nbytes} bytes (compiled loop)"),
                        ("python", "RotaryEmbedding.apply (Python)")):
        print(f"  {label:40} {format_time(per_call[name]):>10} per call")
    ratio = paired_ratio(timings["c_api"], timings["memcpy"])
    print(f"  C API / memcpy: {ratio:.2f}x (goal <= 1.5x)")
    print(f"  Python / C API: {per_call['python'] / per_call['c_api']:.1f}x")


if __name__ == "__main__":
    main()
