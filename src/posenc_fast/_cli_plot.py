"""``python -m posenc_fast plot --out DIR``: PNG figures of the encodings.

Every figure is drawn from what posenc_fast itself computes, so it also shows
that the installed build behaves.  Needs matplotlib (the ``plot`` extra); it
draws on bare ``Figure`` objects with the Agg canvas, so no GUI backend or
pyplot state is touched.
"""

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

INSTALL_HINT = "pip install 'posenc-fast[plot]'"
DPI = 110
# Llama 3.1's rotary setup: the scaled frequencies are drawn for it.
LLAMA3_BASE = 500000.0
LLAMA3_ORIGINAL = 8192
SCALING_FACTOR = 8.0
# Distinct dashes: several methods agree on the fastest or on the slowest pairs.
SCALING_STYLES: dict[str, dict[str, Any]] = {
    "default": dict(color="black", lw=2.6), "linear": dict(color="C0", lw=1.8),
    "ntk": dict(color="C1", lw=1.8, ls="--"), "yarn": dict(color="C2", lw=1.8),
    "llama3": dict(color="C3", lw=1.8, ls="-."),
}


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _pi_ticks(ax: Any) -> None:
    ax.set_yticks([-np.pi, -np.pi / 2, 0, np.pi / 2, np.pi],
                  ["−π", "−π/2", "0", "π/2", "π"])
    ax.set_ylim(-np.pi * 1.08, np.pi * 1.08)


def sinusoidal_heatmap(pf: Any) -> Any:
    """The sinusoidal table in the split layout: sin columns, then cos columns."""
    length, dim = 512, 128
    table = pf.sinusoidal_table(length, dim, layout="split")
    fig = _figure(10, 6)
    ax = fig.add_subplot()
    image = ax.imshow(table, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1,
                      interpolation="nearest", extent=(-0.5, dim - 0.5, length - 0.5, -0.5))
    ax.axvline(dim / 2 - 0.5, color="black", lw=1.5)
    for x, text in ((dim / 4, "sin(p·wᵢ), i = 0 … 63"), (3 * dim / 4, "cos(p·wᵢ), i = 0 … 63")):
        ax.text(x, -8, text, ha="center", va="bottom", fontsize=11)
    ax.set_title(f'Sinusoidal position encoding: sinusoidal_table({length}, {dim}, '
                 f'layout="split"),  wᵢ = 10000^(−2i/{dim})', pad=26)
    ax.set_xlabel("feature column (within each half: fast frequencies left, slow right)")
    ax.set_ylabel("position p")
    fig.colorbar(image, ax=ax, label="value", shrink=0.9)
    return fig


def _wrapped_line(positions: np.ndarray, angle: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of angles in (-pi, pi] with a NaN gap where they wrap (no vertical jumps)."""
    jumps = np.flatnonzero(np.abs(np.diff(angle)) > np.pi) + 1
    return (np.insert(positions.astype(np.float64), jumps, np.nan),
            np.insert(angle, jumps, np.nan))


def rope_angles(pf: Any) -> Any:
    """Rotation angle of fast and slow RoPE pairs against position."""
    dim = 128
    rope = pf.RotaryEmbedding(dim)
    fig = _figure(12, 4.8)
    panels = (("fast pairs: a full turn every few tokens", np.linspace(0, 30, 3001),
               (0, 2, 6)),
              ("slow pairs: a turn or less in 8,192 tokens", np.linspace(0, 8192, 3001),
               (48, 56, 63)))
    for column, (title, positions, pairs) in enumerate(panels):
        ax = fig.add_subplot(1, 2, column + 1)
        cos, sin = rope.cos_sin(positions, dtype=np.float64)
        for pair in pairs:
            angle = np.arctan2(sin[:, pair], cos[:, pair])
            wavelength = 2 * np.pi / rope.inv_freq[pair]
            ax.plot(*_wrapped_line(positions, angle), lw=1.8,
                    label=f"pair {pair}: wavelength {wavelength:,.1f}")
        _pi_ticks(ax)
        ax.set_title(title)
        ax.set_xlabel("position p")
        ax.set_ylabel("rotation angle p·inv_freq[i], wrapped to (−π, π]")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=9, framealpha=0.9)
    fig.suptitle(f"RoPE: each pair i turns by inv_freq[i] = 10000^(−2i/{dim}) per token "
                 f"(RotaryEmbedding({dim}))", fontsize=13)
    return fig


def rope_relative_score(pf: Any) -> Any:
    """dot(rot(q, m), rot(k, n)) against m - n for several shifts of the whole sequence."""
    dim, span = 128, 256
    rope = pf.RotaryEmbedding(dim)
    rng = np.random.default_rng(0)
    # q = k = ones gives RoFormer's long-term decay curve; a random pair shows it
    # is no special case.
    pairs = (("q = k = ones", np.ones(dim), np.ones(dim)),
             ("random q, k", rng.standard_normal(dim), rng.standard_normal(dim)))
    shifts = (0, 1000, 100_000, 1_000_000)
    styles = ("-", "--", ":", "-.")
    fig = _figure(12, 7)
    grid = fig.add_gridspec(2, 2, height_ratios=(3, 1))
    distance = np.arange(-span, span + 1)
    for column, (label, q, k) in enumerate(pairs):
        ax = fig.add_subplot(grid[0, column])
        diff_ax = fig.add_subplot(grid[1, column], sharex=ax)
        scores = []
        for number, (shift, style) in enumerate(zip(shifts, styles)):
            # The query sits at m = shift + span; keys at n = m - distance.
            m = shift + span
            n = m - distance
            q_rot = rope.apply(q, m)
            k_rot = rope.apply(np.tile(k, (n.size, 1)), n)
            scores.append(k_rot @ q_rot)
            ax.plot(distance, scores[-1], style, color=f"C{number}",
                    lw=2.4 if shift == 0 else 1.6, label=f"m = {m:,}")
            if number:
                diff_ax.plot(distance, scores[-1] - scores[0], style, color=f"C{number}", lw=1)
        ax.set_title(f"{label}: the curves for all shifts coincide")
        ax.set_ylabel("score q_m · k_n (float64)")
        ax.grid(alpha=0.3)
        ax.legend(title="query position", fontsize=9)
        diff_ax.set_xlabel("relative position m − n")
        diff_ax.set_ylabel(f"difference to\nm = {span}")
        diff_ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
        diff_ax.grid(alpha=0.3)
    fig.suptitle(f"RoPE: the score of query m and key n depends only on m − n "
                 f"(RotaryEmbedding({dim}), float64)\nShifting the whole sequence by up to 10⁶ "
                 "leaves it unchanged; bottom: the difference, rounding only", fontsize=12)
    return fig


def _scalings() -> dict[str, dict[str, Any] | None]:
    original = {"original_max_position_embeddings": LLAMA3_ORIGINAL}
    return {
        "original (no scaling)": None,
        f"linear ×{SCALING_FACTOR:g}": {"rope_type": "linear", "factor": SCALING_FACTOR},
        f"NTK-aware ×{SCALING_FACTOR:g}": {"rope_type": "ntk", "factor": SCALING_FACTOR},
        f"YaRN ×{SCALING_FACTOR:g}": {"rope_type": "yarn", "factor": SCALING_FACTOR, **original},
        f"Llama 3 ×{SCALING_FACTOR:g}": {"rope_type": "llama3", "factor": SCALING_FACTOR,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        **original},
    }


def rope_scaling(pf: Any) -> Any:
    """Per-pair wavelength and effective interpolation of each scaling method."""
    dim = 128
    curves = {}
    for label, scaling in _scalings().items():
        method = "default" if scaling is None else scaling["rope_type"]
        rope = pf.RotaryEmbedding(dim, base=LLAMA3_BASE, scaling=scaling)
        if rope.attention_factor != 1.0:
            label += f" (attention factor {rope.attention_factor:.3f})"
        curves[label] = (np.asarray(rope.inv_freq), SCALING_STYLES[method])
    original = curves[next(iter(curves))][0]
    fig = _figure(12, 5.2)
    wave_ax, scale_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    pair = np.arange(dim // 2)
    for label, (inv_freq, style) in curves.items():
        wave_ax.plot(pair, 2 * np.pi / inv_freq, label=label, **style)
        scale_ax.plot(pair, original / inv_freq, label=label, **style)
    for ax, length, text in ((wave_ax, LLAMA3_ORIGINAL, "original context 8,192"),
                             (wave_ax, LLAMA3_ORIGINAL * SCALING_FACTOR,
                              "extended context 65,536")):
        ax.axhline(length, color="grey", lw=1, ls="--")
        ax.annotate(text, (0, length), xytext=(2, 3), textcoords="offset points",
                    color="dimgrey", fontsize=9)
    wave_ax.set_yscale("log")
    wave_ax.set_title("wavelength of each pair (tokens per full turn)")
    wave_ax.set_ylabel("wavelength 2π / inv_freq[i]  (log scale)")
    scale_ax.set_title("effective interpolation: original inv_freq / scaled inv_freq")
    scale_ax.set_ylabel("positions divided by")
    for ax in (wave_ax, scale_ax):
        ax.set_xlabel("pair i (fast → slow)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=9)
    fig.suptitle(f"Long-context RoPE scaling, factor {SCALING_FACTOR:g}, on Llama 3.1's rotary "
                 f"setup (head dim {dim}, base {LLAMA3_BASE:,.0f}, original context "
                 f"{LLAMA3_ORIGINAL:,})", fontsize=12)
    return fig


def alibi_bias(pf: Any) -> Any:
    """ALiBi: each head's linear penalty, and one head's causal bias matrix."""
    heads, length = 8, 24
    slopes = pf.alibi_slopes(heads)
    bias = pf.alibi_bias(heads, length, dtype=np.float64)
    fig = _figure(12, 5)
    lines_ax, matrix_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    last = bias[:, -1, ::-1]  # the last query's row: distance 0, 1, 2, ...
    colors = [f"C{h}" for h in range(heads)]
    for h in range(heads):
        lines_ax.plot(np.arange(length), last[h], color=colors[h], lw=1.8,
                      label=f"head {h}: slope 1/{1 / slopes[h]:g}")
    lines_ax.set_title(f"bias added to a score, per head (alibi_slopes({heads}))")
    lines_ax.set_xlabel("distance q_pos − k_pos (tokens back)")
    lines_ax.set_ylabel("bias  −slope · distance")
    lines_ax.grid(alpha=0.3)
    lines_ax.legend(fontsize=9, ncol=2)
    image = matrix_ax.imshow(np.where(np.tril(np.ones((length, length))) > 0, bias[0], np.nan),
                             cmap="viridis", interpolation="nearest")
    matrix_ax.set_title("head 0, causal: alibi_bias(8, 24)[0] (future keys masked)")
    matrix_ax.set_xlabel("key position")
    matrix_ax.set_ylabel("query position")
    fig.colorbar(image, ax=matrix_ax, label="bias")
    fig.suptitle("ALiBi: a fixed linear penalty on distance, steeper for lower heads",
                 fontsize=13)
    return fig


FIGURES: dict[str, Callable[[Any], Any]] = {
    "sinusoidal_table.png": sinusoidal_heatmap,
    "rope_angles.png": rope_angles,
    "rope_relative_score.png": rope_relative_score,
    "rope_scaling.png": rope_scaling,
    "alibi_bias.png": alibi_bias,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``plot``."""
    parser.add_argument("--out", type=Path, default=Path("plots"), metavar="DIR",
                        help="folder for the PNG files (default ./plots)")


def run(args: argparse.Namespace) -> int:
    """Write the figures; print each path; return 2 if matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        print(f"plot needs matplotlib: {INSTALL_HINT}", file=sys.stderr)
        return 2
    import posenc_fast as pf

    args.out.mkdir(parents=True, exist_ok=True)
    for name, draw in FIGURES.items():
        path = args.out / name
        draw(pf).savefig(path)
        print(path)
    return 0
