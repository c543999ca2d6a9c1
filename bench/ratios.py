"""Ratios quoted in the issue notes against NumPy expressions and both layouts
(bench/report.py holds the goal rows, each against its physical limit).

    python3 bench/ratios.py [--rounds N]

Each line: our call and its comparison calls, timed interleaved in this process
by ``posenc_fast._bench.timing.measure`` (one thread); times are medians, ratios
medians over rounds of the per-round ratio (their time / our time > 1: posenc_fast
faster).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

try:
    import posenc_fast as pf
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import posenc_fast as pf

from posenc_fast._bench.timing import measure, paired_ratio


class Times:
    """The calls timed interleaved: ``times.ms(i)``, ``times.ratio(i, j)`` (i's time / j's)."""

    def __init__(self, calls, rounds):
        timings = measure(dict(enumerate(calls)), rounds=rounds)
        self.timings = [timings[i] for i in range(len(calls))]

    def ms(self, i):
        return self.timings[i].median_ns / 1e6

    def ratio(self, i, j):
        return paired_ratio(self.timings[i], self.timings[j])


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    rounds = parser.parse_args().rounds
    pf.set_num_threads(1)
    rng = np.random.default_rng(0)

    # Issue 2: sinusoidal_table(8192, 1024) vs the NumPy expression.
    length, dim = 8192, 1024
    table_out = np.empty((length, dim), np.float32)

    def numpy_table():
        angles = np.outer(np.arange(length, dtype=np.float64),
                          10000.0 ** (-np.arange(0, dim, 2) / dim))
        pe = np.empty((length, dim), np.float32)
        pe[:, 0::2] = np.sin(angles)
        pe[:, 1::2] = np.cos(angles)
        return pe

    t = Times([lambda: pf.sinusoidal_table(length, dim, out=table_out), numpy_table], rounds)
    print(f"sinusoidal_table(8192, 1024) f32: {t.ms(0):.2f} ms; NumPy float64 expression "
          f"{t.ms(1):.2f} ms -> {t.ratio(1, 0):.1f}x faster")

    # Issue 3: RoPE apply on (1, 32, 4096, 128) f32 vs np.copyto and the NumPy expression.
    x = rng.standard_normal((1, 32, 4096, 128)).astype(np.float32)
    out = np.empty_like(x)
    rope = pf.RotaryEmbedding(128, layout="half")
    angles = np.outer(np.arange(4096.0), rope.inv_freq)
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1).astype(np.float32)
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1).astype(np.float32)
    t = Times([lambda: rope.apply(x, out=out), lambda: np.copyto(out, x),
               lambda: x * cos + rotate_half(x) * sin], rounds)
    print(f"RotaryEmbedding.apply (1,32,4096,128) f32: {t.ms(0):.2f} ms = {t.ratio(0, 1):.2f}x "
          f"np.copyto ({t.ms(1):.2f} ms); NumPy x*cos + rotate_half(x)*sin "
          f"{t.ms(2):.2f} ms -> {t.ratio(2, 0):.1f}x faster")

    # Issue 6: both layouts (the goals are in "half"), from memory and from the caches.
    for shape in ((1, 32, 4096, 128), (1, 32, 64, 128)):
        for layout in ("half", "interleaved"):
            rope = pf.RotaryEmbedding(128, layout=layout)
            for dtype in (np.float32, np.float64):
                x = rng.standard_normal(shape).astype(dtype)
                out = np.empty_like(x)
                t = Times([lambda: rope.apply(x, out=out), lambda: np.copyto(out, x),
                           lambda: rope.apply(x, out=x), lambda: np.multiply(x, 1, out=x)],
                          rounds)
                print(f"RotaryEmbedding.apply {shape} {layout} {np.dtype(dtype).name}: "
                      f"out-of-place {t.ratio(0, 1):.2f}x np.copyto, in place "
                      f"{t.ratio(2, 3):.2f}x np.multiply(x, 1, out=x)")

    # Issue 10: add_position_table in place on (8, 2048, 1024) f32.
    x = rng.standard_normal((8, 2048, 1024)).astype(np.float32)
    wpe = rng.standard_normal((2048, 1024)).astype(np.float32)
    positions = np.arange(2048)
    target = np.empty_like(x)
    t = Times([lambda: pf.add_position_table(x, wpe, out=x),
               lambda: np.add(x, wpe[positions], out=x), lambda: np.copyto(target, x)], rounds)
    print(f"add_position_table in place (8,2048,1024) f32: {t.ms(0):.2f} ms; "
          f"np.add(x, table[pos], out=x) {t.ms(1):.2f} ms -> {t.ratio(1, 0):.2f}x; "
          f"np.copyto(x) {t.ms(2):.2f} ms -> ours = {t.ratio(0, 2):.2f}x of a copy")


if __name__ == "__main__":
    main()
